"""InferenceX's ingestion contract, checked on real result files.

InferenceX (github.com/SemiAnalysisAI/InferenceX, read at 843c6254) turns each benchmark result
into an `agg_*.json` entry with `utils/process_result.py`. Its workflows run it so:

- Multinode (`benchmark-multinode-tmpl.yml`): the runner copies each result to
  `${RESULT_FILENAME}_<basename>.json`; a loop over `${RESULT_FILENAME}_*.json` reads the GPU split
  from the name with sed (the last `_gpus_<N>`, `_ctx_<P>`, `_gen_<D>`; no ctx/gen: P = N, D = 0;
  no `_gpus_`: the file is skipped) and runs the script with RESULT_FILENAME=<name without .json>,
  IS_MULTINODE=true, PREFILL_GPUS, DECODE_GPUS.
- Single node (`benchmark-tmpl.yml`): one `${RESULT_FILENAME}.json`, IS_MULTINODE unset.

What the script needs:
- env, always: RUNNER_TYPE, FRAMEWORK, PRECISION, SPEC_DECODING, RESULT_FILENAME, ISL, OSL (int),
  DISAGG ("true" only with IS_MULTINODE=true), MODEL_PREFIX, IMAGE; optional RECIPE_FINGERPRINT,
  KV_P2P_TRANSFER, ROUTER_METADATA (JSON object of exactly non-empty string `name` and `version`).
- env, multinode: PREFILL_GPUS, DECODE_GPUS, PREFILL_NUM_WORKERS, PREFILL_TP, PREFILL_EP,
  DECODE_NUM_WORKERS, DECODE_TP, DECODE_EP (ints), PREFILL_DP_ATTN, DECODE_DP_ATTN (text as is);
  optional {PREFILL,DECODE}_{PP_SIZE,DCP_SIZE,PCP_SIZE} (ints > 0, default 1), PREFILL_HARDWARE and
  DECODE_HARDWARE (both or neither). P + D > 0 and P > 0.
- env, single node: TP, EP_SIZE (ints), DP_ATTENTION; optional PP_SIZE, DCP_SIZE, PCP_SIZE (> 0);
  GPUs = TP * PP * PCP.
- the file: `max_concurrency` (int()), `model_id`, `total_token_throughput`, `output_throughput`
  (float()); and every top-level key ending in "ms" is float(value) / 1000 under the key without
  "_ms", every top-level key containing "tpot" also 1000 / float(value) under "tpot" -> "intvty".
  So: no null, text, list or object under such a key, and no TPOT value of 0.
- per GPU, multinode: total / (P + D), output / D (over P + D when D = 0), input (total - output)
  / P; decode parallelism zeroed (tp, ep 0; pp, dcp, pcp 1) when D = 0. Single node: all over GPUs.
- best effort afterwards (power accounting, never fails the step unless REQUIRE_POWER): numeric
  `benchmark_start_time_unix` < `benchmark_end_time_unix` within max(0.5 s, 1 %) of `duration`, and
  integer `completed`, `total_input_tokens`, `total_output_tokens`.

`ingest` below is this contract written out (not InferenceX's code); `assert_inferencex_contract`
applies it, and the equality with `pdbench collect`, to real files and is meant for other tests
(e.g. on the run directories of the end-to-end tests). With PDBENCH_INFERENCEX_PROCESS_RESULT set to
a checkout's utils/process_result.py it also runs that script on every file and compares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.inferencex_contract import (
    CI_PREFIX,
    ContractError,
    assert_inferencex_contract,
    check_result_file,
    inferencex_env,
    ingest,
    result_files,
    workflow_split,
)

from harness.report.collect import collect

pytestmark = pytest.mark.timeout(120)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "results"
PDBENCH_FIXTURE_RUNS = [
    FIXTURES / "dsr1-fp8-2p4d" / "20261201T100000Z-aaa111",
    FIXTURES / "dsr1-fp8-2p4d" / "20261202T100000Z-bbb222",
    FIXTURES / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34",
    FIXTURES / "tiny-fp32-cpu-nixl-1p2d" / "20261122T034324Z-a3eb41",
]
IX_FIXTURE_RUN = FIXTURES / "inferencex-dsr1-fp8-mi355x-isl_1024_osl_1024"


# --- the contract ----------------------------------------------------------------------------------


# --- fixtures: real files ---------------------------------------------------------------------------


@pytest.mark.parametrize("run", PDBENCH_FIXTURE_RUNS, ids=lambda p: p.parent.name + "/" + p.name)
def test_pdbench_fixture_runs(run: Path) -> None:
    # Recorded before the power window existed in pdbench's files, hence power=False.
    entries = assert_inferencex_contract(run, power=False)
    for agg, path in zip(entries, result_files(run), strict=False):
        data = json.loads(path.read_text())
        split = workflow_split(path.name)
        assert (agg["num_prefill_gpu"], agg["num_decode_gpu"]) == split
        assert agg["median_intvty"] == 1000.0 / data["median_tpot_ms"]
        assert agg["p99.9_e2el"] == data["p99.9_e2el_ms"] / 1000.0


def test_inferencex_fork_files_pass_the_encoded_contract() -> None:
    # A sanity check of the encoding: InferenceX's own benchmark client's files pass it.
    for path in sorted(IX_FIXTURE_RUN.glob("*.json")):
        assert check_result_file(path, power=False) == []
        env = inferencex_env(path, "mi355x-disagg")
        assert (env["PREFILL_GPUS"], env["DECODE_GPUS"]) == ("8", "16")
        agg = ingest(json.loads(path.read_text()), env)
        assert agg["num_prefill_gpu"] == 8 and agg["tput_per_gpu"] > 0


def test_the_checks_catch_what_breaks_inferencex(tmp_path: Path) -> None:
    good = json.loads(result_files(PDBENCH_FIXTURE_RUNS[0])[0].read_text())
    name = "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json"
    cases = [
        ({"goodput_slos_ms": None}, name, "goodput_slos_ms: not a finite number (None)"),  # pdbench before #11
        ({"goodput_slos_ms": {"ttft": 5}}, name, "goodput_slos_ms: not a finite number"),
        ({"std_tpot_ms": 0.0}, name, "std_tpot_ms: 0; InferenceX computes 1000 / std_tpot_ms"),
        ({"conc_ms": 1.0}, name, "overwriting InferenceX's own key"),
        ({"max_concurrency": None}, name, "max_concurrency: not an integer"),
        ({}, "concurrency_8_req_rate_inf_gpus_1_ctx_0_gen_1.json", "no prefill GPU"),
    ]
    for change, fname, needle in cases:
        path = tmp_path / fname
        path.write_text(json.dumps(good | change))
        problems = check_result_file(path, power=False)
        assert any(needle in p for p in problems), (change, problems)
        path.unlink()
    env = inferencex_env(result_files(PDBENCH_FIXTURE_RUNS[0])[0], "x")
    with pytest.raises(ContractError, match=r"goodput_slos_ms=None: TypeError"):
        ingest(good | {"goodput_slos_ms": None}, env)
    with pytest.raises(ContractError, match=r"std_tpot_ms=0.0: ZeroDivisionError"):
        ingest(good | {"std_tpot_ms": 0.0}, env)
    with pytest.raises(ContractError, match="needs a prefill GPU"):
        ingest(good, env | {"PREFILL_GPUS": "0"})
    with pytest.raises(ContractError, match="DISAGG=true needs IS_MULTINODE"):
        ingest(
            good,
            {k: v for k, v in env.items() if k != "IS_MULTINODE"}
            | {"TP": "8", "EP_SIZE": "1", "DP_ATTENTION": "false"},
        )


def test_workflow_split_reads_names_as_the_sed_does() -> None:
    assert workflow_split(f"{CI_PREFIX}_concurrency_8_req_rate_inf_gpus_24_ctx_8_gen_16.json") == (8, 16)
    assert workflow_split(f"{CI_PREFIX}_concurrency_8_req_rate_2.5_gpus_8.json") == (8, 0)
    assert workflow_split(f"{CI_PREFIX}_concurrency_8_req_rate_inf.json") is None


# --- files the project's own writer makes ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from harness import tiny_model

    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


RECIPES = sorted(p.stem for p in (Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def _recipe_bench_config(recipe: str, tmp: Path) -> dict[str, Any]:
    """The bench.json the job of `recipe` runs (its metadata and GPU split), as rendered."""
    from harness.config import load_recipe
    from harness.render import RenderContext, render_job

    out = tmp / f"render-{recipe}"
    out.mkdir()
    render_job(
        load_recipe(recipe),
        out,
        RenderContext(run_dir=str(out), root="/opt/pdbench", python="python", git_commit="0" * 40),
    )
    # An aggregated-only job (one instance as a reference) runs only the aggregated phase's client.
    name = "bench.json" if (out / "bench.json").is_file() else "bench-aggregated.json"
    return json.loads((out / name).read_text())


def _sweep(model_dir: str, result_dir: Path, base_url: str, **kw: Any) -> list[Path]:
    from harness.bench import ClientConfig, run_sweep_detailed

    fields = dict(
        base_url=base_url,
        model="tiny",
        tokenizer=model_dir,
        isl=16,
        osl=4,
        concurrency=[2],
        num_prompts=4,
        num_warmups=0,
        result_dir=str(result_dir),
        health_check_interval_s=0,
    )
    outcomes = run_sweep_detailed(ClientConfig(**(fields | kw)))
    assert all(o.path is not None for o in outcomes), [o.error for o in outcomes]
    return [o.path for o in outcomes]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_point_passes(recipe: str, model_dir: str, tmp_path: Path) -> None:
    # Each recipe's own metadata and split, completions without goodput and chat with goodput.
    from helpers.bench_fake_server import FakeServer

    bench = _recipe_bench_config(recipe, tmp_path)
    split = ("prefill_gpus", "decode_gpus") if "prefill_gpus" in bench else ("gpus",)
    common = {k: bench[k] for k in (*split, "metadata")}
    with FakeServer() as srv:
        a = _sweep(model_dir, tmp_path / "a", srv.base_url, concurrency=[1, 2], **common)
        b = _sweep(
            model_dir, tmp_path / "b", srv.base_url, endpoint="chat", goodput={"ttft": 60000, "tpot": 60000}, **common
        )
    for run in (tmp_path / "a", tmp_path / "b"):
        entries = assert_inferencex_contract(run)
        assert all(e["num_prefill_gpu"] == bench.get("prefill_gpus", bench.get("gpus")) for e in entries), entries
    rb = json.loads(b[0].read_text())
    assert rb["goodput_slos"] == {"ttft_ms": 60000, "tpot_ms": 60000} and rb["backend"] == "openai-chat"
    assert json.loads(a[0].read_text())["goodput_slos"] is None
    # collect's entries are the ingested ones (the points are unverified: nothing was scraped).
    assert collect([tmp_path / "a"], hw="x").entries == []
    assert len(collect([tmp_path / "a"], hw="x", include_unverified=True).entries) == 2


def test_degenerate_points_pass(model_dir: str, tmp_path: Path) -> None:
    # Every request failed (no TPOT sample: vLLM writes 0 there), and one-token outputs.
    from helpers.bench_fake_server import FakeServer

    with FakeServer(policy=lambda n, b: "500") as srv:
        (failed,) = _sweep(model_dir, tmp_path / "f", srv.base_url, prefill_gpus=1, decode_gpus=2)
    with FakeServer() as srv:
        (one,) = _sweep(
            model_dir,
            tmp_path / "o",
            srv.base_url,
            osl=1,
            prefill_gpus=1,
            decode_gpus=1,
            scrape=["decode-0=decode@" + srv.base_url],
        )  # no /metrics there: unverified
    for path in (failed, one):
        (agg,) = assert_inferencex_contract(path)
        data = json.loads(path.read_text())
        assert not any("tpot" in k for k in data) and not any("intvty" in k for k in agg)
    # A point cut short with requests never sent: its not_sent count is a plain integer key.
    with FakeServer(policy=lambda n, b: "hang" if n == 1 else None) as srv:
        (cut,) = _sweep(
            model_dir,
            tmp_path / "c",
            srv.base_url,
            concurrency=[1],
            num_prompts=3,
            point_timeout_s=1.0,
            prefill_gpus=1,
            decode_gpus=1,
        )
    data = json.loads(cut.read_text())
    assert (data["completed"], data["failed"], data["not_sent"]) == (1, 1, 1) and data["stop_reason"]
    assert_inferencex_contract(cut)
    # No request completed: no latency statistic at all (n/a, where vLLM writes 0s).
    data = json.loads(failed.read_text())
    assert data["latency_stats"] == "n/a: no measured request completed" and not data["zero_per_token_stats"]
    assert not [k for k in data if k.endswith("_ms")]
    assert "median_tpot_ms" in json.loads(one.read_text())["zero_per_token_stats"]
    md = json.loads(one.read_text())["metadata"]
    assert md["valid"] is None and md["validity"]["verdict"] == "unverified"
    assert {r["name"]: r["status"] for r in md["validity"]["rules"]}["kv_transferred"] == "not_checked"


def test_one_server_without_a_split(model_dir: str, tmp_path: Path) -> None:
    """One aggregated server: with --gpus N the file name says `_gpus_N`, which InferenceX's multinode
    workflow reads as N GPUs of one worker (prefill N, decode 0); its single-node branch gets the same
    per-GPU figures from TP = N. Without a GPU count the name has no `_gpus_`: the multinode workflow
    skips the file rather than invent per-GPU figures, and the single-node one needs TP from its CI."""
    from helpers.bench_fake_server import FakeServer

    from harness.report.normalise import per_gpu

    with FakeServer() as srv:
        (agg_file,) = _sweep(model_dir, tmp_path / "g", srv.base_url, gpus=8)
        (unknown,) = _sweep(model_dir, tmp_path / "u", srv.base_url, endpoint="chat", goodput={"e2el": 60000})
    data = json.loads(agg_file.read_text())
    (multi,) = assert_inferencex_contract(agg_file)
    single = ingest(data, inferencex_env(agg_file, "x", multinode=False))
    expected = per_gpu(data["total_token_throughput"], data["output_throughput"], 8, 0)
    for e in (multi, single):
        assert (e["tput_per_gpu"], e["output_tput_per_gpu"], e["input_tput_per_gpu"]) == pytest.approx(expected)
        assert e["disagg"] is False
    assert multi["num_prefill_gpu"] == 8 and multi["num_decode_gpu"] == 0 and single["tp"] == 8
    assert workflow_split(f"{CI_PREFIX}_{unknown.name}") is None
    (single_unknown,) = assert_inferencex_contract(unknown)  # keys pass; per-GPU figures need the CI's TP
    assert single_unknown["is_multinode"] is False
    md = json.loads(unknown.read_text())["metadata"]
    assert (md["disagg"], md["gpu_split"]) == (False, "unknown")
    # collect writes the disaggregated schema only; it says why it leaves these out.
    result = collect([tmp_path / "g", tmp_path / "u"], hw="x", include_unverified=True)
    assert result.entries == [] and all("not a disaggregated point" in s.reason for s in result.skipped)


def test_collect_holds_what_inferencex_computes() -> None:
    # The valid, disaggregated fixture points: collect keeps them by default; equal to ingestion.
    run = PDBENCH_FIXTURE_RUNS[0]
    entries = {e["conc"]: e for e in collect([run], hw="test-hw").entries}
    assert sorted(entries) == [64, 128]
    for path in result_files(run):
        data = json.loads(path.read_text())
        if data["max_concurrency"] in entries:
            env = inferencex_env(path, "test-hw")
            assert entries[data["max_concurrency"]] == ingest(data, env)
            assert entries[data["max_concurrency"]]["tput_per_gpu"] == data["total_token_throughput"] / 48


def test_aggregated_baseline_points_pass_and_are_collected(model_dir: str, tmp_path: Path) -> None:
    """The baseline of tiny-fp32-cpu-nixl-1p2d-vs-agg (3 instances of TP 1) as its job writes it:
    InferenceX's multinode workflow reads `_gpus_3` as 3 prefill-only GPUs, its single-node branch
    gets the same per-GPU figures from TP = 3; collect writes the same entry, disagg false."""
    from helpers.bench_fake_server import FakeServer

    from harness.config import load_recipe
    from harness.render import RenderContext, render_job

    out = tmp_path / "render"
    out.mkdir()
    ctx = RenderContext(run_dir=str(out), root="/opt/pdbench", python="python", git_commit="0" * 40)
    render_job(load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg"), out, ctx)
    bench = json.loads((out / "bench-aggregated.json").read_text())
    assert bench["gpus"] == 3 and "prefill_gpus" not in bench
    with FakeServer() as srv:
        (path,) = _sweep(model_dir, tmp_path / "a", srv.base_url, gpus=3, metadata=bench["metadata"])
    assert path.name == "concurrency_2_req_rate_inf_gpus_3.json"
    (multi,) = assert_inferencex_contract(tmp_path / "a")
    data = json.loads(path.read_text())
    single = ingest(data, inferencex_env(path, "x", multinode=False))
    assert multi["disagg"] is False and single["tp"] == 3
    assert (
        multi["tput_per_gpu"]
        == pytest.approx(single["tput_per_gpu"])
        == pytest.approx(data["total_token_throughput"] / 3)
    )
    (entry,) = collect([tmp_path / "a"], hw="x", include_unverified=True).entries
    assert (entry["disagg"], entry["framework"], entry["num_prefill_gpu"], entry["num_decode_gpu"]) == (
        False,
        "vllm",
        3,
        0,
    )
    assert (entry["prefill_tp"], entry["prefill_num_workers"], "kv_p2p_transfer" in entry) == (1, 3, False)
