"""Minimal prefill/decode proxy for disaggregated vLLM (`pdbench proxy`)."""

from harness.proxy.app import ProxyConfig, build_app, serve

__all__ = ["ProxyConfig", "build_app", "serve"]
