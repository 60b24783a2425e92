"""benchmark.workloads: validate refuses what one job cannot measure and names the key of a bad
workload; each workload is the job's benchmark section with its mapping deep-merged in; the
rendered job has a client and config per workload writing into workloads/<name>/; the node's
validity check, `pdbench status` and the report (each workload a run of its own) see its points;
a resume of such a job is refused; a workload may have another client (aiperf, `vllm bench serve`),
whose artifacts land in its folder and which status and the report then read there. The runs
themselves: tests/node/test_node_runtime.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.external_clients import write_fake_clients

from harness.config.load import ConfigError, load_recipe
from harness.node.runtime import _invalid_points
from harness.render.job import RenderContext, render_job
from harness.report.bottleneck import limit_lines
from harness.report.build import build_report
from harness.report.collect import collect
from harness.report.load import load_runs
from harness.resume_run import check_same_measurement
from harness.rundir import RunDir
from harness.rundir.paths import AIPERF_ARTIFACTS, CLIENT_COMMAND, CLIENT_RUN, VLLM_BENCH_RESULT
from harness.submit.follow import summary
from harness.submit.manage import status_lines
from harness.submit.points import planned
from harness.topology import plan, workload_bench_name

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
TWO = "benchmark.workloads={long-prompts: {isl: 512, concurrency: [2]}, strict: {validity: {hit_tolerance: 0.01}}}"
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "results" / RECIPE / "20261122T032441Z-e8da34"


@pytest.mark.parametrize(
    ("recipe", "sets", "key", "said"),
    [
        (RECIPE, ["benchmark.workloads.Bad_Name.isl=5"], "", "benchmark.workloads: name 'Bad_Name' must be"),
        (RECIPE, ["benchmark.workloads.-x.isl=5"], "", "not starting with '-'"),
        (RECIPE, ["benchmark.workloads.trace.isl=-1"], "benchmark.workloads.trace.isl", "greater than 0 (got -1)"),
        (RECIPE, ["benchmark.workloads.trace.islx=5"], "benchmark.workloads.trace.islx", "unknown key"),
        (
            RECIPE,
            ["benchmark.workloads.trace.concurrency=[1, 1]"],
            "benchmark.workloads.trace.concurrency",
            "must be unique",
        ),
        (
            RECIPE,
            ["benchmark.workloads.a.slo_search={slos: {t: {ttft_p99: 100}}}"],
            "",
            "benchmark.workloads.a.slo_search: a workload cannot set slo_search",
        ),
        (RECIPE, ["benchmark.workloads.a.workloads={}"], "benchmark.workloads.a.workloads", "cannot set workloads"),
        (
            RECIPE,
            ["benchmark.workloads.a.seed=3", "benchmark.slo_search={slos: {t: {ttft_p99: 100}}}"],
            "",
            "benchmark.workloads: an SLO search measures one workload per job; drop benchmark.slo_search or",
        ),
        (
            RECIPE,
            ["benchmark.workloads.a.seed=3", "proxy.arms=[pdbench, vllm-router]"],
            "",
            "benchmark.workloads: not supported with proxy.arms yet",
        ),
        (
            "tiny-fp32-cpu-nixl-1p2d-vs-agg",
            ["benchmark.workloads.a.seed=3"],
            "",
            "benchmark.workloads: not supported with topology.aggregated yet (the aggregated baseline would need "
            "every workload too)",
        ),
        (
            "tiny-fp32-cpu-nixl-1p2d-vs-agg",
            ["benchmark.workloads.a.seed=3", "topology.aggregated_only=true"],
            "",
            "drop topology.aggregated or benchmark.workloads",
        ),
    ],
)
def test_validate_refuses_workloads_one_job_cannot_measure(recipe: str, sets: list[str], key: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe, sets)
    assert said in str(e.value)
    if key:
        assert e.value.key == key


def test_a_workload_is_the_jobs_benchmark_section_with_its_mapping_deep_merged() -> None:
    rr = load_recipe(RECIPE, [TWO, "benchmark.validity={max_failed_share: 0.1}", "benchmark.workloads.strict.isl=512"])
    b = rr.recipe.benchmark
    assert list(b.workloads) == ["long-prompts", "strict"]  # recipe order
    long = b.workload("long-prompts")
    assert (long.isl, long.osl, long.concurrency) == (512, b.osl, [2])  # a list replaced, the rest the job's
    assert long.seed == b.seed and long.workloads == {}
    strict = b.workload("strict")
    assert (strict.validity.hit_tolerance, strict.validity.max_failed_share) == (0.01, 0.1)  # a mapping merged
    assert strict.isl == 512 and strict.concurrency == b.concurrency  # --set into a workload's key
    # Without workloads the lock (and the fingerprint) reads as before.
    assert "workloads" not in load_recipe(RECIPE).locked()["recipe"]["benchmark"]


def _render(run: Path, *sets: str) -> None:
    rr = load_recipe(RECIPE, [TWO, *sets])
    render_job(rr, run, RenderContext(str(run), "/opt/pdbench", "/py", None), plan(rr))


def test_the_job_renders_a_client_and_config_per_workload(tmp_path: Path) -> None:
    _render(tmp_path)
    assert json.loads((tmp_path / "plan.json").read_text())["workloads"] == ["long-prompts", "strict"]
    server = (tmp_path / "server.sh").read_text()
    for name in ("long-prompts", "strict"):
        fn = server.split(f"proc_{workload_bench_name(name).replace('-', '_')}()")[1].split("\n}")[0]
        assert f'"${{RUN_DIR}}/bench-workload-{name}.json"' in fn and f'"${{RUN_DIR}}/workloads/{name}"' in fn
    own = json.loads((tmp_path / "bench.json").read_text())
    later = json.loads((tmp_path / "bench-workload-long-prompts.json").read_text())
    assert "workloads" not in own and "workload" not in own["metadata"]  # the job's own sweep: none
    assert later["metadata"] == own["metadata"] | {"workload": "long-prompts"}
    assert (later["isl"], later["concurrency"]) == (512, [2])
    differ = {k for k in own.keys() | later.keys() if own.get(k) != later.get(k)}
    assert differ == {"metadata", "isl", "concurrency", "proxy_timings_dir", "server_logs_dir", "runtime_records_dir"}
    assert later["proxy_timings_dir"] == "../../proxy-timings" and later["server_logs_dir"] == "../../logs"
    # `pdbench status` counts every workload's points after the job's own.
    labels = [p.label for p in planned(RunDir(tmp_path), with_results=False)]
    assert own["concurrency"] == [1, 4] and labels == [
        "C=1",
        "C=4",
        "C=2 [workload long-prompts]",
        "C=1 [workload strict]",
        "C=4 [workload strict]",
    ]


def test_a_resume_of_a_job_with_workloads_is_refused(tmp_path: Path) -> None:
    _render(tmp_path)
    with pytest.raises(ConfigError, match="--resume of a job with workloads is not supported yet"):
        check_same_measurement(tmp_path, load_recipe(RECIPE, [TWO]))
    with pytest.raises(ConfigError, match="not supported yet"):  # nor a run with them resumed without
        check_same_measurement(tmp_path, load_recipe(RECIPE))


def _workload_run(root: Path, valid: bool = True) -> Path:
    """A copy of the fixture run with one workload, long-prompts, of the same points at ISL 512."""
    run = root / RECIPE / FIXTURE.name
    shutil.copytree(FIXTURE, run)
    where = run / "workloads" / "long-prompts"
    where.mkdir(parents=True)
    for f in sorted(run.glob("concurrency_*.json")):
        data = json.loads(f.read_text())
        data["metadata"] |= {"workload": "long-prompts"} | ({} if valid else {"valid": False})
        data["input_lens"] = [512 for _ in data.get("input_lens") or []]
        data["isl"] = 512
        data["output_throughput"] /= 2
        (where / f.name).write_text(json.dumps(data))
    return run


def test_report_and_collect_read_each_workload_as_a_run_of_its_own(tmp_path: Path) -> None:
    run = _workload_run(tmp_path)
    loaded = load_runs([run])
    assert [r.label for r in loaded.runs] == [f"{RECIPE}/{run.name}", f"{RECIPE}/{run.name}/workloads/long-prompts"]
    own, later = loaded.runs
    assert len(own.points) == len(later.points) == 2  # the job's own points stay its own
    assert all(p.metadata["workload"] == "long-prompts" for p in later.points)
    assert all(p.metadata["recipe"] == RECIPE for p in later.points)  # the job's metadata
    assert later.status == own.status
    report = build_report([run])
    assert len(report.table) == 4  # every table row of both
    collected = collect([run], hw="h200", include_unverified=True)  # the fixture's points: no verdict
    assert len(collected.entries) == 4, collected.skipped  # every workload point is a result file


def test_the_nodes_validity_check_covers_workload_points(tmp_path: Path) -> None:
    run = _workload_run(tmp_path, valid=False)
    invalid = _invalid_points(run)
    assert invalid and all(x.startswith("workloads/long-prompts/concurrency_") for x in invalid), invalid


# --- a workload measured by another client ---------------------------------------------------

# An agentic workload (test_external_clients_vllm's settings): aiperf runs InferenceX's agentic
# scenario as the sweep's client, then `vllm bench serve` measures the same servers as its cross-check.
AGENTIC = {
    "client": "aiperf",
    "cross_check": ["vllm"],
    "concurrency": [2],
    "endpoint": "chat",
    "num_prompts": 8,
    "aiperf": {"scenario": "inferencex-agentx-mvp", "weka_trace": "/traces/weka", "benchmark_duration_s": 6},
}


def _agentic(run: Path, **executables: str) -> None:
    """Render the job with the `agentic` workload (its clients' executables as given)."""
    agentic = AGENTIC | {"aiperf": AGENTIC["aiperf"] | ({"executable": executables["aiperf"]} if executables else {})}
    if executables:
        agentic["vllm_bench"] = {"executable": executables["vllm"]}
    rr = load_recipe(RECIPE, [f"benchmark.workloads={json.dumps({'agentic': agentic})}"])
    render_job(rr, run, RenderContext(str(run), str(ROOT), sys.executable, None), plan(rr))


@pytest.mark.parametrize(
    ("sets", "key", "said"),
    [
        # The job's cross-check is every workload's unless it sets its own: a trace it cannot send.
        (
            ["benchmark.cross_check=[vllm]", "benchmark.workloads.t={dataset: mooncake_trace, dataset_path: /t.jsonl}"],
            "benchmark.workloads.t.cross_check",
            "`vllm bench serve` cannot send dataset 'mooncake_trace'",
        ),
        (
            ["benchmark.cross_check=[vllm]", "benchmark.workloads.t.client=vllm"],
            "benchmark.workloads.t.cross_check",
            "'vllm' is already the sweep's client",
        ),
        (
            ["benchmark.workloads.t={client: aiperf, aiperf: {scenario: inferencex-agentx-mvp}}"],
            "benchmark.workloads.t.aiperf",
            "replays a trace: set public_dataset or weka_trace",
        ),
        (["benchmark.workloads.t.client=locust"], "benchmark.workloads.t.client", "(got 'locust')"),
    ],
)
def test_a_workloads_clients_are_checked_as_the_jobs_are(sets: list[str], key: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe(RECIPE, sets)
    assert e.value.key == key and said in str(e.value), str(e.value)


def test_a_workload_can_change_the_client(tmp_path: Path) -> None:
    _agentic(tmp_path)
    own = json.loads((tmp_path / "bench.json").read_text())
    later = json.loads((tmp_path / "bench-workload-agentic.json").read_text())
    assert (own["client"], own["cross_check"], own["endpoint"]) == ("pdbench", [], "completions")  # the job's
    assert (later["client"], later["cross_check"], later["endpoint"]) == ("aiperf", ["vllm"], "chat")
    assert (later["concurrency"], later["num_prompts"]) == ([2], 8)
    assert later["aiperf"] | AGENTIC["aiperf"] == later["aiperf"] and later["metadata"]["workload"] == "agentic"
    server = (tmp_path / "server.sh").read_text()
    fn = server.split(f"proc_{workload_bench_name('agentic').replace('-', '_')}()")[1].split("\n}")[0]
    assert '"${RUN_DIR}/bench-workload-agentic.json"' in fn and '--results-dir "${RUN_DIR}/workloads/agentic"' in fn


def test_a_workloads_other_clients_write_into_its_folder(tmp_path: Path) -> None:
    """The rendered client line of the workload, run as its node runs it (`server.sh proc`), with
    stand-ins for aiperf and vLLM's client: every point, command and log is the workload's."""
    aiperf, vllm = write_fake_clients(tmp_path / "bin", sys.executable)
    run = tmp_path / "results" / RECIPE / "20261201T000000Z-abc123"
    run.mkdir(parents=True)
    _agentic(run, aiperf=str(aiperf), vllm=str(vllm))
    env = os.environ | {
        "RUN_DIR": str(run),
        "PDBENCH_PYTHON": sys.executable,
        "PDBENCH_NODE_0_ADDR": "127.0.0.1",
        "PDBENCH_NODE_1_ADDR": "127.0.0.1",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        ["bash", str(run / "server.sh"), "proc", workload_bench_name("agentic")],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job, where = RunDir(run), RunDir(run).workload("agentic")

    point = where.client_point("aiperf", 2)
    assert point == run / "workloads" / "agentic" / "clients" / "aiperf" / "conc_2"
    command = shlex.split((point / CLIENT_COMMAND).read_text())
    assert command[0] == str(aiperf) and command[command.index("--endpoint-type") + 1] == "chat"
    assert command[command.index("--scenario") + 1] == "inferencex-agentx-mvp"
    assert command[command.index("--output-artifact-dir") + 1] == str(point / AIPERF_ARTIFACTS)
    assert "http://127.0.0.1:8100/metrics" in command  # the servers the job's client scrapes
    assert (point / AIPERF_ARTIFACTS / "profile_export.jsonl").is_file()
    assert json.loads((point / CLIENT_RUN).read_text())["returncode"] == 0
    assert "fake aiperf: wrote" in where.client_log("aiperf", 2).read_text()

    vllm_point = where.client_point("vllm", 2)
    result = json.loads((vllm_point / VLLM_BENCH_RESULT).read_text())
    assert (result["backend"], result["num_prompts"], result["max_concurrency"]) == ("openai-chat", 8, 2)
    assert where.client_log("vllm", 2).is_file()
    # Nothing of it at the run's top: its clients' points and logs are the workload's alone, and
    # aiperf measured the sweep, so pdbench wrote no result.
    assert not job.client_points("aiperf") and not job.client_points("vllm")
    assert not job.client_log("aiperf", 2).exists() and where.results() == job.results() == []


def test_status_and_summary_name_a_workloads_other_client_not_missing_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "results" / RECIPE / "20261201T000000Z-abc123"
    run.mkdir(parents=True)
    _agentic(run)
    job = RunDir(run)
    job.workload("agentic").client_point("aiperf", 2).mkdir(parents=True)
    # pdbench's points are the job's own sweep's: aiperf's sweep writes no result file to wait for.
    assert [p.label for p in planned(job)] == ["C=1", "C=4"]
    line = f"aiperf measured workload agentic, 1 of 1 point(s) written, under {run}/workloads/agentic/clients/aiperf/conc_<C>/"
    assert line in "\n".join(status_lines(job))
    summary(job, 0)
    out = capsys.readouterr().out
    assert "succeeded: 0 of 2 point(s) valid" in out and line in out and "agentic" not in out.replace(line, ""), out


def test_the_report_reads_a_workload_another_client_measured(tmp_path: Path) -> None:
    """A workload without pdbench's points, but with `vllm bench serve`'s: its cross-check rows are
    read from its folder, and every other table is the job's own."""
    run = _workload_run(tmp_path)
    shutil.rmtree(run / "workloads" / "long-prompts")
    where = RunDir(run).workload("agentic")
    aiperf = where.client_point("aiperf", 2)
    (aiperf / AIPERF_ARTIFACTS).mkdir(parents=True)
    (aiperf / CLIENT_RUN).write_text(json.dumps({"returncode": 0, "wall_s": 20.0, "cpu_s": 5.0}))
    vllm = where.client_point("vllm", 2)
    vllm.mkdir(parents=True)
    (vllm / VLLM_BENCH_RESULT).write_text(json.dumps({"max_concurrency": 2, "completed": 8, "failed": 0}))
    (vllm / CLIENT_RUN).write_text(json.dumps({"returncode": 0, "wall_s": 10.0, "cpu_s": 4.0}))
    label = f"{RECIPE}/{run.name}/workloads/agentic"
    loaded = load_runs([run])
    assert [r.label for r in loaded.runs] == [f"{RECIPE}/{run.name}", label]
    assert loaded.runs[1].points == [] and limit_lines(loaded.runs) == limit_lines(loaded.runs[:1])  # no line
    report = build_report([run])
    (cross,) = [s for s in report.sections if s.title.startswith("Cross-check")]
    assert [(row[0], row[2]) for row in cross.rows] == [(label, "2")]
    assert len(report.table) == 2  # the job's own points only
    assert len(collect([run], hw="h200", include_unverified=True).entries) == 2
