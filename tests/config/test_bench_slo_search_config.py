"""benchmark.slo_search in a recipe: what it accepts, what it refuses (naming the key), and how
it reaches the job's client (bench.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench.client_config import ClientConfig
from harness.config import ConfigError, load_recipe

SEARCH = ["benchmark.slo_search.slos.tight.ttft_p90=800", "benchmark.slo_search.slos.tight.tpot_p90=40"]


def test_a_search_is_read_with_its_defaults() -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", [*SEARCH, "benchmark.concurrency=1,2,4,8"])
    search = rr.recipe.benchmark.slo_search
    assert search is not None
    assert search.slos == {"tight": {"ttft_p90": 800.0, "tpot_p90": 40.0}}
    assert rr.recipe.benchmark.search_start == 1  # the ladder's first value
    assert (search.repeats.max, search.repeats.ci_half_width, search.repeats.confidence) == (2, 0.03, 0.95)


def test_a_recipe_without_a_search_keeps_its_fingerprint() -> None:
    plain = load_recipe("tiny-fp32-cpu-nixl-1p1d")
    assert plain.recipe.benchmark.slo_search is None
    assert "slo_search" not in json.dumps(plain.locked())  # left out while off: old fingerprints hold
    assert load_recipe("tiny-fp32-cpu-nixl-1p1d", SEARCH).fingerprint != plain.fingerprint


@pytest.mark.parametrize(
    ("sets", "key", "words"),
    [
        (["benchmark.slo_search.slos.tight.ttft_p9x=800"], "slo_search", "slos.tight.ttft_p9x"),
        (["benchmark.slo_search.slos.tight.ttft_p90=-5"], "slo_search", "slos.tight.ttft_p90: the bound must be"),
        (["benchmark.slo_search.slos.tight.ttft_p90=true"], "slo_search.slos.tight.ttft_p90", "valid number"),
        ([*SEARCH, "benchmark.slo_search.start=3"], "slo_search.start", "3 is not a ladder value"),
        ([*SEARCH, "benchmark.concurrency=4,1"], "concurrency", "must be ascending"),
        (["benchmark.slo_search.slos.tight.ttft_p95=800"], "slo_search", "add 95 to benchmark.percentiles"),
        ([*SEARCH, "benchmark.cross_check=vllm"], "slo_search", "cross_check empty"),
        (["benchmark.slo_search.slos={}"], "slo_search", "no SLO given"),
        ([*SEARCH, "benchmark.slo_search.repeats.confidence=1"], "slo_search.repeats.confidence", "less than 1"),
    ],
)
def test_a_bad_search_is_refused_naming_its_key(sets: list[str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p1d", sets)
    assert f"benchmark.{key}" in str(e.value) and words in str(e.value), str(e.value)


def test_a_search_in_a_job_of_two_sweeps_is_refused() -> None:
    one_shape = ["benchmark.shapes=[]", "benchmark.isl=16", "benchmark.osl=16"]
    with pytest.raises(ConfigError, match="runs two sweeps"):
        load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg", [*SEARCH, *one_shape])
    only = load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg", [*SEARCH, *one_shape, "topology.aggregated_only=true"])
    assert only.recipe.benchmark.slo_search is not None


def test_the_search_reaches_the_client(tmp_path: Path) -> None:
    from harness.render import RenderContext, render_job
    from harness.rundir import RunDir

    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d", [*SEARCH, "benchmark.concurrency=1,2,4", "benchmark.slo_search.start=2"]
    )
    render_job(rr, tmp_path, RenderContext(str(tmp_path), "/opt/pdbench", "/py", None))
    bench = json.loads(RunDir(tmp_path).bench_config().read_text())
    cfg = ClientConfig.model_validate(bench | {"result_dir": str(tmp_path)})
    assert cfg.slo_search is not None and cfg.slo_search.slos["tight"]["tpot_p90"] == 40.0
    assert cfg.search_start == 2


def test_a_resumed_search_keeps_its_points_and_says_the_search_decides(tmp_path: Path) -> None:
    """`pdbench submit --resume` of a search: the finished ladder points are copied and count as
    measured; the plan says the search measures only the others it needs, then its repeats."""
    import subprocess
    import sys

    from helpers.bench_results import bench_result

    from harness.rundir import ResultName

    recipe = "dsr1-fp8-mi355x-moriio-1p2d"  # renders without a model or vLLM here (--skip-flag-check)
    sets = [*SEARCH, "benchmark.concurrency=[1,2,4,8]", "benchmark.isl=1024", "benchmark.osl=1024"]
    argv = [sys.executable, "-m", "harness", "submit", "--recipe", recipe, "--dry-run", "--skip-flag-check"]
    argv += ["--results-dir", str(tmp_path), *(w for s in sets for w in ("--set", s))]
    assert subprocess.run(argv, capture_output=True, text=True, timeout=120).returncode == 0
    (old,) = (tmp_path / recipe).iterdir()
    model = json.loads((old / "bench.json").read_text())["model"]
    for c in (1, 2):
        n = max(16, 10 * c)  # the defaults: min_prompts, prompts_multiplier
        r = bench_result(max_concurrency=c, num_prompts=n, completed=n, random_input_len=1024, random_output_len=1024)
        r = r.model_copy(update={"model_id": model})
        (old / ResultName(c, float("inf"), prefill_gpus=8, decode_gpus=16).filename).write_text(r.model_dump_json())
    r = subprocess.run([*argv, "--resume", str(old)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "the SLO search counts 2 of its 4 ladder point(s) as measured" in r.stdout, r.stdout
    (new,) = (p for p in (tmp_path / recipe).iterdir() if p != old)
    assert len(list(new.glob("concurrency_*.json"))) == 2
    assert json.loads((new / "bench.json").read_text())["slo_search"]["slos"]["tight"]["ttft_p90"] == 800
