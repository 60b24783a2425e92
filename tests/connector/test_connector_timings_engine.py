"""Decode writes one timing line per request the proxy tagged (connector/timings.py): real
schedulers and worker connectors in one process, real pulls over loopback, a fake forward
(test_connector_worker.Engine)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from conftest import require_vllm

require_vllm(module_level=True)  # CI sets PDBENCH_REQUIRE_VLLM: a missing vLLM fails, never skips

from helpers.connector_engines import (  # noqa: E402
    BS,
    LAYERS,
    TOTAL_HEADS,
    C,
    engines,  # noqa: F401  (fixture)
    make_request,
    model_dir,  # noqa: F401  (fixture)
    prefill_and_params,
)
from vllm.v1.request import RequestStatus  # noqa: E402

from connector.timings import PREFIX  # noqa: E402


def wait_lines(directory: Path, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The timings files' lines once they hold `n` (the writer thread flushes after each batch)."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(directory.glob(f"{PREFIX}*.jsonl"))
        lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_a_tagged_load_gets_one_line_with_its_pull_and_first_step(engines: Any, tmp_path: Path) -> None:  # noqa: F811
    p = engines("kv_producer")
    d = engines("kv_consumer", timings_dir=str(tmp_path))
    _, params = prefill_and_params(p, 40)
    tagged = make_request(40, params={**params, "pdbench_id": "bench-3"}, max_tokens=2)
    d.s.add_request(tagged)
    d.run_until(lambda f: tagged.is_finished(), timeout=10)
    _, params = prefill_and_params(p, 40)
    untagged = make_request(40, params=params, max_tokens=2)
    d.s.add_request(untagged)
    d.run_until(lambda f: untagged.is_finished(), timeout=10)
    assert tagged.status == untagged.status == RequestStatus.FINISHED_LENGTH_CAPPED
    (line,) = wait_lines(tmp_path, 1)
    d.close()  # stops the writer: a line for the untagged request would be in by now
    assert wait_lines(tmp_path, 2, timeout=0) == [line]
    assert line["id"] == "bench-3" and line["req"] == tagged.request_id and line["ok"] is True
    assert line["early"] is False
    assert line["blocks"] == 3 and line["bytes"] == 3 * LAYERS * TOTAL_HEADS * BS * C * 4 and line["path"] == "tcp"
    # Each duration is one process's clock; the pull lies inside the scheduler's load.
    assert 0 < line["pull_wait_ms"] <= line["pull_ms"] < line["load_ms"], line
    assert line["queue_ms"] >= 0 and line["ready_ms"] >= 0 and line["first_step_ms"] > 0, line
    # Nothing of either request is left in the connector (its state is bounded by the requests).
    worker = d.workers[0]._worker
    assert not d.s.connector._sched._timed and not worker._timed and not worker._loaded


def test_an_early_pulls_wait_for_prefill_is_its_pull_wait(engines: Any, tmp_path: Path) -> None:  # noqa: F811
    """The overlapped flow: decode asks before prefill has the request; the line says so, and the
    wait for prefill's compute is in pull_wait_ms (which the breakdown takes out of the transfer)."""
    p = engines("kv_producer")
    d = engines("kv_consumer", timings_dir=str(tmp_path))
    kvt = p.s.vllm_config.kv_transfer_config
    assert kvt is not None
    endpoint = {"remote_engine_id": kvt.engine_id, "remote_host": "127.0.0.1", "remote_port": p.port, "tp_size": 1}
    key = "pd-early-1"
    preq = make_request(40, params={"do_remote_decode": True, "pull_key": key}, max_tokens=1)
    params = {"do_remote_prefill": True, **endpoint, "remote_request_id": key, "pull_key": key, "pdbench_id": "b-9"}
    dreq = make_request(40, params=params, max_tokens=2, prefix=list(preq.prompt_token_ids or []))
    d.s.add_request(dreq)
    for _ in range(5):  # the pull goes out and waits at prefill
        d.step()
    assert dreq.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    time.sleep(0.2)  # prefill computes later: the pull's wait is at least this long
    p.s.add_request(preq)
    p.run_until(lambda f: any(o.request_id == preq.request_id for o in f))
    p.step()
    d.run_until(lambda f: dreq.is_finished(), timeout=10)
    (line,) = wait_lines(tmp_path, 1)
    assert line["id"] == "b-9" and line["early"] is True and line["ok"] is True, line
    assert 200 <= line["pull_wait_ms"] <= line["pull_ms"] < line["load_ms"], line
