"""Per-request KV load timings of the bundled connector (connector/timings.py): written by decode
for requests the proxy tagged, joined with the proxy's records by the client's id.

Here the writer, the proxy's flow that passes the id on and the reader that joins the lines;
test_connector_timings_engine.py has decode writing them, test_connector_timings_e2e.py a real job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from connector.timings import PREFIX, TimingsFile
from harness.proxy.backends import Backend
from harness.proxy.flows import PdbenchFlow, TwoPhaseFlow
from harness.rundir.proxy_timings import read_all


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for f in sorted(directory.glob(f"{PREFIX}*.jsonl")) for x in f.read_text().splitlines()]


def _wait_lines(directory: Path, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The file's lines once it holds `n` (the writer thread flushes after each batch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = _lines(directory)
        if len(lines) >= n:
            return lines
        time.sleep(0.01)
    raise AssertionError(f"{directory} holds {len(_lines(directory))} timing lines, not {n}")


def test_timings_file_writes_every_line_in_order(tmp_path: Path) -> None:
    f = TimingsFile(str(tmp_path / "t"))  # the directory is made on the first line
    for i in range(500):
        f.write({"id": str(i)})
    f.close()
    assert [x["id"] for x in _lines(tmp_path / "t")] == [str(i) for i in range(500)]
    assert f.dropped == 0 and f.path.name == f"{PREFIX}{os.getpid()}.jsonl"


# -- the proxy: the client's id reaches decode's kv_transfer_params ---------------------------


def _prefill() -> Backend:
    p = Backend("prefill", "http://p:1")
    p.kv_endpoint = {"remote_engine_id": "E", "remote_host": "h", "remote_port": 5, "tp_size": 1}
    return p


@pytest.mark.parametrize("overlap", [False, True])
def test_pdbench_flow_passes_the_clients_id_to_decode(overlap: bool) -> None:
    flow, p, d = PdbenchFlow(overlap), _prefill(), Backend("decode", "http://d:1")
    kv = None if overlap else {"do_remote_prefill": True, "remote_engine_id": "E", "remote_request_id": "pd-x"}
    body = {"prompt": "hi", "max_tokens": 4}
    leg = flow.decode(body, p, 0, d, "pd-x", kv)
    out = flow.tag_decode(leg, "bench-7")
    assert out["kv_transfer_params"]["pdbench_id"] == "bench-7"
    assert out["kv_transfer_params"]["remote_request_id"] == "pd-x"
    # Copies, not edits: the body, prefill's params and the untagged leg stay as they were.
    assert "kv_transfer_params" not in body and (kv is None or "pdbench_id" not in kv)
    assert "pdbench_id" not in leg["kv_transfer_params"]
    # An untimed request carries no id, whatever was tagged before it (the id is an argument).
    assert "pdbench_id" not in flow.tag_decode(flow.decode(body, p, 0, d, "pd-x", kv), None)["kv_transfer_params"]
    # Without prefill's params decode recomputes: nothing to time, nothing added.
    assert PdbenchFlow().tag_decode(PdbenchFlow().decode(body, p, 0, d, "pd-x", None), "bench-7") == body
    # Other connectors' legs are unchanged.
    nixl = TwoPhaseFlow()
    assert nixl.tag_decode(nixl.decode(body, p, 0, d, None, {"a": 1}), "bench-7")["kv_transfer_params"] == {"a": 1}


def test_read_all_joins_the_connectors_line_to_the_proxys_record(tmp_path: Path) -> None:
    proxy = {"router_ms": 1.0, "prefill_ms": 50.0, "decode_ms": 40.0, "first_byte_ms": 91.0}
    (tmp_path / "proxy-timings-1.jsonl").write_text(
        "".join(json.dumps({"id": i, **proxy}) + "\n" for i in ("a", "b", "c")) + '{"id": "d", "rou'
    )
    line = {"req": "cmpl-x", "pull_ms": 7.0, "first_step_ms": 3.0, "ok": True}
    (tmp_path / f"{PREFIX}2.jsonl").write_text(
        json.dumps({"id": "a", **line}) + "\n" + json.dumps({"id": "z", **line}) + "\n" + '{"id": "b", "pu'
    )
    got = read_all(tmp_path, {"a", "b", "z"})
    assert set(got) == {"a", "b"}  # z: the connector's line alone is no record; c: not asked for
    assert got["a"]["connector"] == {"id": "a", **line} and got["a"]["decode_ms"] == 40.0
    assert "connector" not in got["b"]  # its line is still being written
