"""Prefill/decode (PD) proxy for disaggregated vLLM (`pdbench proxy`)."""

from harness.proxy.config import ProxyConfig
from harness.proxy.server import Serving, serve, serving

__all__ = ["ProxyConfig", "Serving", "serve", "serving"]
