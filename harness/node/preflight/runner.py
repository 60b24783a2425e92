"""Runs a node's checks concurrently, each bounded, and turns what they return into Problems."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    node: int
    check: str  # "ports", "gpus", "weights", "disk", "memory", "rdma", "clock", "image", ...
    cause: str

    def __str__(self) -> str:
        return f"node {self.node}: {self.cause}"


def run_checks(node: int, checks: dict[str, Callable[[], list[str]]], timeout_s: float = 20) -> list[Problem]:
    """Run the checks concurrently, each in a daemon thread bounded by `timeout_s` (a check
    still running then is a problem, and its thread is abandoned); an exception is a problem
    naming its check. Problems come back in the order of `checks`."""
    results: dict[str, list[Problem]] = {}

    def run(name: str, check: Callable[[], list[str]]) -> None:
        try:
            results[name] = [Problem(node, name, cause) for cause in _as_causes(check())]
        except Exception as e:  # any failure of a check is reported, not raised
            results[name] = [Problem(node, name, f"check {name} failed: {type(e).__name__}: {e}")]

    threads = {
        name: threading.Thread(target=run, args=(name, check), name=f"preflight-{name}", daemon=True)
        for name, check in checks.items()
    }
    deadline = time.monotonic() + timeout_s
    for t in threads.values():
        t.start()
    problems: list[Problem] = []
    for name, t in threads.items():
        t.join(max(0.0, deadline - time.monotonic()))
        if name in results:
            problems += results[name]
        else:
            problems.append(
                Problem(
                    node,
                    name,
                    f"check {name} did not finish within {timeout_s:g} s (a hung mount, GPU driver or tool?)",
                )
            )
    return problems


def _as_causes(result: object) -> Iterable[str]:
    if isinstance(result, str):
        return [result]
    return [str(r) for r in (result or [])]  # type: ignore[attr-defined]
