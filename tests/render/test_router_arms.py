"""proxy.arms: validate refuses arms the job cannot measure, naming why; the plan and the rendered
job carry each later arm's router and client (its results under arms/<arm>/, its arm in every
result's metadata, the same settings and seed); the report sets the arms side by side with an
interval over the runs given, and keeps the later arms out of the run's own table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.config.load import ConfigError, load_recipe
from harness.render.job import RenderContext, render_job
from harness.report.build import build_report
from harness.topology import arm_bench_name, arm_proxy_name, plan

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
ARMS = "proxy.arms=[pdbench, vllm-router]"
FIXTURE = Path(__file__).parents[1] / "fixtures" / "results" / RECIPE / "20261122T032441Z-e8da34"


@pytest.mark.parametrize(
    ("recipe", "sets", "said"),
    [
        (RECIPE, ["proxy.arms=[vllm-router, pdbench]"], "proxy.kind (pdbench) first"),
        (RECIPE, ["proxy.arms=[pdbench]"], "two or more routers"),
        (RECIPE, ["proxy.arms=[pdbench, pdbench]"], "each once"),
        ("tiny-fp32-cpu-pdbench-1p1d", [ARMS], "proxy.arms: vllm-router does not serve the pdbench connector"),
        ("tiny-fp32-cpu-pdbench-1p1d", [ARMS], "leave vllm-router out of proxy.arms for pdbench"),
        ("dsr1-fp8-mi355x-moriio-1p2d", [ARMS], "the moriio connector's workers register with the router"),
        ("tiny-fp32-cpu-nixl-1p2d-vs-agg", [ARMS], "drop topology.aggregated"),
        (RECIPE, [ARMS, "proxy.policy=session"], "proxy.policy: session is pdbench's proxy's"),
    ],
)
def test_validate_refuses_arms_the_job_cannot_measure(recipe: str, sets: list[str], said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe, sets)
    assert said in str(e.value)


def test_each_later_arm_has_its_router_and_client_over_the_same_servers(tmp_path: Path) -> None:
    rr = load_recipe(RECIPE, ["proxy.kind=vllm-router", "proxy.arms=[vllm-router, pdbench]"])
    p = plan(rr)
    assert p.arms == ("pdbench",)
    arm = [x for x in p.processes() if x.arm is not None]
    assert [(x.name, x.kind, x.port, x.phase) for x in arm] == [
        (arm_proxy_name("pdbench"), "proxy", p.proxy_port, "disagg")
    ]
    # Without arms the plan reads as before: no arm key anywhere.
    assert "arm" not in json.dumps(plan(load_recipe(RECIPE)).to_json())

    render_job(rr, tmp_path, RenderContext(str(tmp_path), "/opt/pdbench", "/py", None), p)
    server = (tmp_path / "server.sh").read_text()
    router_fn = server.split(f"proc_{arm_proxy_name('pdbench').replace('-', '_')}()")[1].split("\n}")[0]
    words = router_fn.replace('"', "").split()
    assert words[words.index("-m") + 1 : words.index("-m") + 3] == ["harness", "proxy"]
    assert words[words.index("--connector") + 1] == "nixl"
    client_fn = server.split(f"proc_{arm_bench_name('pdbench').replace('-', '_')}()")[1].split("\n}")[0]
    assert '"${RUN_DIR}/bench-arm-pdbench.json"' in client_fn and '"${RUN_DIR}/arms/pdbench"' in client_fn
    own, later = (json.loads((tmp_path / n).read_text()) for n in ("bench.json", "bench-arm-pdbench.json"))
    assert own["metadata"]["arm"] == own["metadata"]["proxy"] == "vllm-router"
    assert later["metadata"]["arm"] == later["metadata"]["proxy"] == "pdbench"
    # The same settings and seed (the same prompts); only the router and the arm folder's way back differ.
    differ = {k for k in own.keys() | later.keys() if own.get(k) != later.get(k)}
    assert differ == {"metadata", "proxy_timings_dir", "server_logs_dir", "runtime_records_dir"}
    assert own["proxy_timings_dir"] is None and later["proxy_timings_dir"] == "../../proxy-timings"
    assert later["server_logs_dir"] == "../../logs" and later["runtime_records_dir"] == "../../state"
    assert {k: v for k, v in own["metadata"].items() if k not in ("arm", "proxy")} == {
        k: v for k, v in later["metadata"].items() if k not in ("arm", "proxy")
    }


def _arm_run(root: Path, name: str, scale: float) -> Path:
    """A copy of the fixture run as an arms job: its points pdbench's, arms/vllm-router/ slower by `scale`."""
    run = root / RECIPE / name
    shutil.copytree(FIXTURE, run)
    (run / "arms" / "vllm-router").mkdir(parents=True)
    for f in sorted(run.glob("concurrency_*.json")):
        data = json.loads(f.read_text())
        data["metadata"] |= {"arm": "pdbench", "proxy": "pdbench"}
        f.write_text(json.dumps(data))
        data["metadata"] |= {"arm": "vllm-router", "proxy": "vllm-router"}
        data["output_throughput"] /= scale
        data["median_ttft_ms"] *= scale
        (run / "arms" / "vllm-router" / f.name).write_text(json.dumps(data))
    return run


def test_report_sets_the_arms_side_by_side_with_an_interval_over_runs(tmp_path: Path) -> None:
    runs = [_arm_run(tmp_path, "20261122T032441Z-aaaaaa", 1.5), _arm_run(tmp_path, "20261122T032442Z-bbbbbb", 2.0)]
    one = build_report(runs[:1])
    # The run's own table holds its own router's points only.
    assert len(one.table) == len(list(runs[0].glob("concurrency_*.json")))
    (section,) = [s for s in one.sections if s.title.startswith("Router arms")]
    by = {(r[0], r[3]): dict(zip(section.headers, r, strict=True)) for r in section.rows}
    own = json.loads(next(runs[0].glob("concurrency_1_*.json")).read_text())
    assert by[("pdbench", "1")]["Runs"] == "1" and by[("pdbench", "1")]["Output tok/s"].endswith("± ?")
    assert [r[0] for r in section.rows[:2]] == ["pdbench", "vllm-router"]  # per concurrency, the arms together
    assert "vllm-router: no TTFT breakdown" in section.note and "pdbench: no TTFT" not in section.note
    two = build_report(runs)
    (section,) = [s for s in two.sections if s.title.startswith("Router arms")]
    cell = {(r[0], r[3]): dict(zip(section.headers, r, strict=True)) for r in section.rows}[("vllm-router", "1")]
    mean = own["output_throughput"] * (1 / 1.5 + 1 / 2.0) / 2
    assert cell["Runs"] == "2" and cell["Output tok/s"].startswith(f"{mean:.2f} ± " if mean < 10 else f"{mean:.1f} ± ")
    assert "?" not in cell["Output tok/s"]
    # Without a second arm there is nothing to set beside: no section.
    assert not [s for s in build_report([FIXTURE]).sections if s.title.startswith("Router arms")]


def test_validate_passes_a_vllm_router_arms_line_through_its_parser(monkeypatch) -> None:
    from harness.render import vllm_router
    from harness.submit.check import Planned, router_problems

    rr = load_recipe(RECIPE, [ARMS])  # pdbench's proxy first: vllm-router only as the later arm
    checked: list[list] = []

    def refuse(argv: list) -> list[str]:
        checked.append(argv)
        return ["refused for the test"]

    monkeypatch.setattr(vllm_router, "check_argv", refuse)
    assert router_problems(Planned(rr, plan(rr))) == ["vllm-router rejects its disagg line: refused for the test"]
    assert "--vllm-pd-disaggregation" in checked[0]
    assert router_problems(Planned(load_recipe(RECIPE), plan(load_recipe(RECIPE)))) == []  # no router, no check
