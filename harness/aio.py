"""The event loop every pdbench server and client runs on: uvloop when importable (less
CPU per request for the proxy, the mock engine and the bench client), else asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on new_event_loop()."""
    if hasattr(asyncio, "Runner"):
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(main)
    loop = new_event_loop()  # pragma: no cover - Python 3.10
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
