"""Prefill/decode (PD) proxy for disaggregated vLLM (`pdbench proxy`)."""

from harness.proxy.config import ProxyConfig
from harness.proxy.server import build_app, serve

__all__ = ["ProxyConfig", "build_app", "serve"]
