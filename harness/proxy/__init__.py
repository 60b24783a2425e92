"""Prefill/decode (PD) proxy for disaggregated vLLM (`pdbench proxy`)."""

from harness.proxy.app import build_app, serve
from harness.proxy.config import ProxyConfig

__all__ = ["ProxyConfig", "build_app", "serve"]
