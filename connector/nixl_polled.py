"""vLLM's NIXL connectors with NIXL's progress thread off (recipe `connector.progress_thread: false`).

vLLM builds its NIXL agent with the default `nixl_agent_config`, whose progress thread polls
UCX with no delay (`pthrDelay = 0`): on a CPU node each engine then keeps a core about 90 % busy
even while idle, and on a 2-core machine a NIXL job runs at half speed (docs/predict.md: TPOT
23.3 -> 10.9 ms at c=1 with the thread off). Without it the transfers progress when vLLM polls
for them, as every other engine step does. vLLM has no switch for it, so this module hands vLLM
the same classes under the same names, built while the NIXL modules' `nixl_agent_config`
defaults `enable_prog_thread` to False; everything else is vLLM's own.

vLLM loads it with `kv_connector_module_path: connector.nixl_polled` (a module path takes
priority over vLLM's registry of names). It imports nothing of harness, as the rest of
`connector/`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm.logger import init_logger

try:
    from vllm.distributed.kv_transfer.kv_connector.v1 import nixl as _vllm_nixl
except ImportError:  # vLLM before the package split: one file
    from vllm.distributed.kv_transfer.kv_connector.v1 import nixl_connector as _vllm_nixl  # type: ignore[attr-defined,no-redef]

# Under vLLM's logger, so the line lands in the server's log with vLLM's own.
logger = init_logger(f"vllm.{__name__}")

# Where vLLM's NIXL workers bind `nixl_agent_config`: `nixl/` in vLLM 0.32, `nixl_connector.py` before.
_NIXL_MODULES = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"


@contextmanager
def progress_thread_off() -> Iterator[int]:
    """While open, every vLLM NIXL module's `nixl_agent_config` builds configs with the progress
    thread off; yields how many modules it changed and restores them on leaving."""
    patched: list[tuple[Any, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(_NIXL_MODULES) or module is None:
            continue
        original = getattr(module, "nixl_agent_config", None)
        if original is None:
            continue
        patched.append((module, original))
        module.nixl_agent_config = functools.partial(original, enable_prog_thread=False)  # type: ignore[attr-defined]
    if not patched:
        raise RuntimeError(
            f"connector.nixl_polled: no module under {_NIXL_MODULES} binds nixl_agent_config in this "
            "vLLM; connector.progress_thread: false cannot be applied (remove it from the recipe)"
        )
    try:
        yield len(patched)
    finally:
        for module, original in patched:
            module.nixl_agent_config = original


def _without_progress_thread(base: type) -> type:
    class Polled(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with progress_thread_off():
                super().__init__(*args, **kwargs)
            logger.info("pdbench: NIXL's progress thread is off (connector.progress_thread: false)")

    Polled.__name__ = Polled.__qualname__ = base.__name__  # vLLM's logs name the class
    return Polled


NixlConnector = _without_progress_thread(_vllm_nixl.NixlConnector)
# vLLM before 0.32 has no push variant.
if hasattr(_vllm_nixl, "NixlPushConnector"):
    NixlPushConnector = _without_progress_thread(_vllm_nixl.NixlPushConnector)
