"""Per-request timings of the proxy, for the benchmark's TTFT breakdown.

A request that carries `X-Pdbench-Id` (the benchmark client sets it) gets one JSON line in
`<timings_dir>/proxy-timings-<pid>.jsonl` (one file per proxy process, appended, flushed per
line so the client can read a point's lines as soon as the point ends). Times are offsets in
ms from the request's arrival, all on this process's monotonic clock:

    router_ms        arrival -> first upstream leg sent (read, parse, pick the instances)
    prefill_ms       prefill leg sent -> its answer read (prefill queue and compute); absent
                     for an aggregated instance
    decode_ms        decode leg sent (or the prefill's answer, if later) -> its first byte:
                     the KV transfer, the decode's scheduling and its first token
    first_byte_ms    arrival -> the decode's first byte, which the proxy relays at once

The bundled connector's decode side writes its own lines into the same directory
(`connector-timings-<pid>.jsonl`, fields in connector/timings.py), keyed by the same id, which
the proxy passes on in decode's kv_transfer_params; `read_all` joins them to the proxy's
record as its `connector` entry.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO, Any

from connector.timings import PREFIX as CONNECTOR_PREFIX

HEADER = "X-Pdbench-Id"


class Stamps:
    """The moments of one request (time.perf_counter values)."""

    __slots__ = ("decode_first", "decode_sent", "id", "prefill_done", "prefill_sent", "t0")

    def __init__(self, request_id: str) -> None:
        self.id = request_id
        self.t0 = time.perf_counter()
        self.prefill_sent: float | None = None
        self.prefill_done: float | None = None
        self.decode_sent: float | None = None
        self.decode_first: float | None = None

    def record(self) -> dict[str, Any] | None:
        """The JSON line, or None when the request never got a first byte from decode."""
        if self.decode_sent is None or self.decode_first is None:
            return None
        ms = lambda a, b: round((b - a) * 1000.0, 4)  # noqa: E731
        first_sent = min(t for t in (self.prefill_sent, self.decode_sent) if t is not None)
        out: dict[str, Any] = {"id": self.id, "router_ms": ms(self.t0, first_sent)}
        decode_from = self.decode_sent
        if self.prefill_sent is not None and self.prefill_done is not None:
            out["prefill_ms"] = ms(self.prefill_sent, self.prefill_done)
            decode_from = max(self.decode_sent, self.prefill_done)
        out["decode_ms"] = ms(decode_from, self.decode_first)
        out["first_byte_ms"] = ms(self.t0, self.decode_first)
        return out


class TimingLog:
    """The proxy process's timings file; opened on the first record."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._file: IO[str] | None = None

    def write(self, stamps: Stamps) -> None:
        rec = stamps.record()
        if rec is None:
            return
        if self._file is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            # Line-buffered: a point's lines are on disk when its requests have ended.
            self._file = open(self.dir / f"proxy-timings-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
        self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _lines(directory: Path, prefix: str, ids: set[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(Path(directory).glob(f"{prefix}*.jsonl")):
        with open(f) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if isinstance(rec, dict) and rec.get("id") in ids:
                    out[rec["id"]] = rec
    return out


def read_all(directory: Path, ids: set[str]) -> dict[str, dict[str, Any]]:
    """Every record of `ids` in the proxy processes' files of `directory`, each with the bundled
    connector's line of the request, where there is one, as its `connector` entry."""
    out = _lines(directory, "proxy-timings-", ids)
    for rid, line in _lines(directory, CONNECTOR_PREFIX, set(out)).items():
        out[rid]["connector"] = line
    return out
