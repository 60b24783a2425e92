"""Prefill/decode (PD) proxy for disaggregated vLLM (`pdbench proxy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.proxy.config import ProxyConfig

if TYPE_CHECKING:
    from harness.proxy.server import Serving, serve, serving

__all__ = ["ProxyConfig", "Serving", "serve", "serving"]


def __getattr__(name: str) -> Any:
    # The server (aiohttp, the metrics stack) on first use, not when the CLI registers
    # `pdbench proxy`: a quarter of a second of every pdbench process's start otherwise.
    if name in ("Serving", "serve", "serving"):
        from harness.proxy import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
