"""pdbench's bundled vLLM KV connector: layer-streamed KV over plain TCP, no RDMA, no polling.

vLLM loads it with ``kv_connector_module_path: connector`` and ``kv_connector:
PdbenchConnector``. The transfer modules (layout, staging, transport) need only
torch, so they are tested and benchmarked without vLLM; the vLLM-facing class is
imported on first use, after a check that the installed vLLM is one it supports
(``connector.vllm_compat``), so an unsupported vLLM fails at start naming its version.
"""

from typing import Any

__all__ = ["PdbenchConnector"]


def __getattr__(name: str) -> Any:
    if name == "PdbenchConnector":
        from connector.vllm_compat import require_supported_vllm

        require_supported_vllm()
        from connector.connector import PdbenchConnector

        return PdbenchConnector
    raise AttributeError(name)
