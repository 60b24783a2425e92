"""A sweep that is an SLO search (benchmark.slo_search), end to end against a server whose time to
first token grows with the requests in flight, so each SLO fails at a known concurrency.

The server: each request waits PER_S for every request in flight when it arrives (itself
included) before it answers. A point of concurrency C with rate inf and no warmups sends its
first C requests at once (waits 1..C x PER_S) and each later one as another finishes (C x
PER_S): its p90 TTFT is about C x PER_S once it sends more than C requests.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from helpers.bench_fake_server import FakeServer

from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from harness.bench.results import ResultExistsError
from harness.rundir import RunDir

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
PER_S = 0.05
LADDER = [1, 2, 3, 4, 6, 8, 12, 16]
# tight: C=2 (p90 100 ms) meets, C=3 (150 ms) does not; loose: C=4 (200 ms) meets, C=6 (300 ms) does not.
SLOS = {"tight": {"ttft_p90": 125}, "loose": {"ttft_p90": 275}}


class SaturatingServer(FakeServer):
    """FakeServer whose time to first token is PER_S per request in flight at arrival."""

    def __init__(self, per_s: float = PER_S) -> None:
        super().__init__(token_delay=0.001)
        self.per_s, self.in_flight = per_s, 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        try:
            await asyncio.sleep(self.per_s * self.in_flight)
            return await super()._handle(request)
        finally:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def _settings(
    model_dir: str, result_dir: Path, base_url: str, search: dict[str, Any] | None = None, **top: Any
) -> dict[str, Any]:
    return (
        dict(
            base_url=base_url,
            model="tiny",
            tokenizer=model_dir,
            isl=16,
            osl=4,
            concurrency=LADDER,
            num_prompts=3 * max(LADDER),  # well past each point's first wave
            num_warmups=0,
            result_dir=str(result_dir),
            prefill_gpus=1,
            decode_gpus=2,
            workers=1,
            slo_search={"slos": SLOS, "repeats": {"max": 2, "ci_half_width": 1e-9}} | (search or {}),
        )
        | top
    )


def test_a_search_doubles_fails_bisects_and_repeats(model_dir: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    with SaturatingServer() as srv:
        cfg = ClientConfig(**_settings(model_dir, run, srv.base_url, num_prompts=24))
        outcomes = run_sweep_detailed(cfg)
        sent = len(srv.bodies)
        # A finished search in the folder: a second run refuses, naming the files; a resumed one
        # counts every point it keeps as measured (the repeats too) and sends nothing.
        with pytest.raises(ResultExistsError, match=r"slo_search\.json"):
            run_sweep_detailed(cfg)
        first = json.loads((run / "slo_search.json").read_text())
        again = run_sweep_detailed(cfg.model_copy(update={"resume": True}))
        assert len(srv.bodies) == sent and all(o.kept for o in again)
    resumed = json.loads((run / "slo_search.json").read_text())
    assert json.loads((run / "superseded" / "slo_search.json").read_text()) == first
    assert [s["file"] for s in resumed["steps"]] == [s["file"] for s in first["steps"]] and resumed["done"]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    record = json.loads((run / "slo_search.json").read_text())
    steps = [(s["concurrency"], s["repeat"], s["why"]) for s in record["steps"]]
    # tight: start 1, up 2, up 4 (fails), bisect 3 (fails). loose reuses them: up 8 (fails), bisect 6 (fails).
    ladder = [(1, 0, "start"), (2, 0, "up"), (4, 0, "up"), (3, 0, "bisect"), (8, 0, "up"), (6, 0, "bisect")]
    assert steps[:6] == ladder, steps
    assert record["best"] == {"tight": 2, "loose": 4} and record["first_failing"] == {"tight": 3, "loose": 6}
    assert record["violated"] == {"tight": ["ttft"], "loose": ["ttft"]}
    # Each best measured twice more (ci_half_width this small is never reached): repeats/1/, repeats/2/.
    assert sorted(steps[6:]) == [(2, 1, "repeat"), (2, 2, "repeat"), (4, 1, "repeat"), (4, 2, "repeat")]
    assert record["done"] is True and record["ladder"] == LADDER and record["start"] == 1
    for c in (2, 4):
        rep = record["repeats"][str(c)]
        assert len(rep["samples"]) == 3 and rep["stopped"] == "max" and rep["half_width"] is not None
    # Every step names its file, which carries the same verdict in metadata.slo_search.
    for s in record["steps"]:
        result = json.loads((run / s["file"]).read_text())
        md = result["metadata"]["slo_search"]
        assert md["repeat"] == s["repeat"] and result["max_concurrency"] == s["concurrency"]
        assert {n: v["meets"] for n, v in md["slos"].items()} == s["meets"]
        assert s["devices"] == 3 and s["goodput_per_device"] == pytest.approx(result["total_token_throughput"] / 3)
        assert s["file"].startswith(f"repeats/{s['repeat']}/") == (s["repeat"] > 0)
    by_step = {(s["concurrency"], s["repeat"]): s for s in record["steps"]}
    assert by_step[(2, 0)]["meets"] == {"tight": True, "loose": True}
    assert by_step[(3, 0)]["meets"] == {"tight": False, "loose": True}
    assert by_step[(6, 0)]["meets"] == {"tight": False, "loose": False}
    assert by_step[(3, 0)]["violations"]["tight"][0].startswith("ttft_p90 ")
    # The points the search did not need are written nowhere.
    top = sorted(json.loads(p.read_text())["max_concurrency"] for p in RunDir(run).results())
    assert top == [1, 2, 3, 4, 6, 8]
    # A repeat sends prompts of its own (the first measurement's would hit the prefix cache).
    assert len({b["prompt"] for b in srv.bodies}) == len(srv.bodies)

    # `pdbench report` counts the ladder's points once, not their repeats.
    from harness.report.load import load_runs

    RunDir(run).plan.write_text("{}")  # a pdbench run directory, as a job's is
    (loaded,) = load_runs([run]).runs
    assert sorted(p.concurrency for p in loaded.points) == [1, 2, 3, 4, 6, 8]


def test_a_failing_start_bisects_down(model_dir: str, tmp_path: Path) -> None:
    with SaturatingServer() as srv:
        cfg = ClientConfig(**_settings(model_dir, tmp_path, srv.base_url, {"start": 8, "repeats": {"max": 0}}))
        run_sweep_detailed(cfg)
    record = json.loads((tmp_path / "slo_search.json").read_text())
    steps = [(s["concurrency"], s["why"]) for s in record["steps"]]
    # tight: 8 fails; bisect the indices -1..5: 3 fails, 1 meets, 2 meets. loose reuses them: 3
    # meets it, so bisect 3..5: 4 meets, 6 fails.
    assert steps == [(8, "start"), (3, "bisect"), (1, "bisect"), (2, "bisect"), (4, "bisect"), (6, "bisect")]
    assert record["best"] == {"tight": 2, "loose": 4} and record["done"] is True
    assert {c: r["stopped"] for c, r in record["repeats"].items()} == {"2": "max", "4": "max"}
    assert not (tmp_path / "repeats").exists()  # max 0: no repeats


def test_an_interrupted_search_is_not_done(model_dir: str, tmp_path: Path) -> None:
    """Ctrl-C in `pdbench bench` during a search: the point so far is written, slo_search.json
    keeps every step so far with done false, and the bench exits 130."""
    run = tmp_path / "run"
    with SaturatingServer() as srv:
        config = tmp_path / "bench.json"
        config.write_text(json.dumps(_settings(model_dir, run, srv.base_url, num_prompts=60)))
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", "bench", "--config", str(config), "--progress", "plain"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            record = run / "slo_search.json"
            deadline = time.monotonic() + 60
            # Wait until the search has recorded its first step and is measuring the next point.
            while time.monotonic() < deadline and proc.poll() is None:
                if record.is_file() and json.loads(record.read_text())["steps"] and len(srv.bodies) > 60 + 10:
                    break
                time.sleep(0.05)
            assert proc.poll() is None and json.loads(record.read_text())["steps"], "the search never got going"
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = out.decode()
    assert proc.returncode == 130, text
    doc = json.loads(record.read_text())
    assert doc["done"] is False and doc["best"] == {"tight": None, "loose": None}
    assert [s["concurrency"] for s in doc["steps"]][:1] == [1]
    assert "SLO search: stopped before its end" in text and "written as interrupted" in text


def test_a_repeat_has_evidence_and_sentinels_of_its_own(model_dir: str, tmp_path: Path) -> None:
    """A repeat's /metrics scrapes and sentinel records go under repeats/<k>/; its sentinel prompts
    are new ones, answered by the reference just before it, not the first measurement's again."""
    with FakeServer(token_delay=0.001) as ref, SaturatingServer(per_s=0.001) as target:
        settings = _settings(
            model_dir,
            tmp_path,
            target.base_url,
            {"slos": {"any": {"ttft_p90": 60_000}}, "repeats": {"max": 1, "ci_half_width": 1e-9}},
            concurrency=[1, 2, 3, 4],
            num_prompts=20,
            scrape=[f"prefill-0=prefill@{ref.base_url}"],
        )
        outcomes = run_sweep_detailed(ClientConfig(**settings))
        reference_prompts = [b["prompt"] for b in ref.bodies]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    record = json.loads((tmp_path / "slo_search.json").read_text())
    # Precondition: every point meets, so the search climbs 1, 2, 4 (the top) and repeats 4 once.
    assert [(s["concurrency"], s["repeat"]) for s in record["steps"]] == [(1, 0), (2, 0), (4, 0), (4, 1)]
    first, again = (tmp_path / "sentinels", tmp_path / "repeats" / "1" / "sentinels")
    assert sorted(p.name for p in first.iterdir()) == [
        "concurrency_1.json",
        "concurrency_2.json",
        "concurrency_4.json",
        "reference.json",
    ]
    assert sorted(p.name for p in again.iterdir()) == ["concurrency_4.json", "reference.json"]
    assert (tmp_path / "repeats" / "1" / "metrics" / "concurrency_4").is_dir()
    assert (tmp_path / "metrics" / "concurrency_4").is_dir()
    repeat = json.loads((tmp_path / record["steps"][-1]["file"]).read_text())
    assert repeat["sentinels"]["record"] == "repeats/1/sentinels/concurrency_4.json"
    assert repeat["sentinels"]["matched"] == repeat["sentinels"]["sent"] == 4

    def prompts(path: Path) -> set[str]:
        return {s["prompt"] for s in json.loads(path.read_text())["sentinels"]}

    assert not prompts(first / "concurrency_4.json") & prompts(again / "concurrency_4.json")
    # The reference answered every ladder point's sentinels before the sweep (3 was never run),
    # then the repeat's: 4 points x 4, and 4 more.
    assert len(reference_prompts) == 4 * 4 + 4


def test_a_search_past_its_total_timeout_is_not_done(model_dir: str, tmp_path: Path) -> None:
    """total_timeout_s cuts the running point short (written, stop_reason): it meets no SLO, the
    points left are not run and slo_search.json keeps done false."""
    with SaturatingServer() as srv:
        # C=1 sends 60 requests of about 50 ms each: 3 s, cut at 1 s.
        cfg = ClientConfig(**_settings(model_dir, tmp_path, srv.base_url, num_prompts=60, total_timeout_s=1.0))
        outcomes = run_sweep_detailed(cfg)
    assert len(outcomes) == 1 and outcomes[0].error is not None and "total timeout" in outcomes[0].error
    record = json.loads((tmp_path / "slo_search.json").read_text())
    (step,) = record["steps"]
    assert step["concurrency"] == 1 and step["meets"] == {"tight": False, "loose": False}
    assert step["violations"]["tight"][-1].startswith("cut short: total timeout")
    assert record["done"] is False and record["best"] == {"tight": None, "loose": None}
