"""benchmark.profile: the loader's checks, the rendered profiler flags and nsys wrap (checked by
the installed vLLM's own parser), and PointProfiler's calls, waits and failures against small
HTTP servers that answer /start_profile and /stop_profile as vLLM's router does."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web
from conftest import require_vllm
from helpers.profile_fakes import PROFILE_PROMPTS, ProfiledFake, profiled_sweep

from harness import tiny_model
from harness.bench import ClientConfig, stops
from harness.bench.profile import PointProfiler, perturbation
from harness.bench.sweep import INTERRUPTED, run_sweep_detailed
from harness.config import load_recipe
from harness.config.benchmark import ProfileSettings
from harness.config.load import ConfigError, ResolvedRecipe
from harness.render import RenderContext, render_job
from harness.render.commands import concrete, serve_lines, server_argv
from harness.rundir.profile_summary import WindowFigures, capture_dir, point_dir
from harness.topology import plan

CTX = RenderContext(
    run_dir="/shared/results/RUN", root="/opt/pdbench", python="/opt/pdbench/.venv/bin/python", git_commit="0123abcd"
)


# --- the loader --------------------------------------------------------------------------


def test_a_point_outside_the_sweep_is_a_loader_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p1d", ["benchmark.profile={points: [3]}"])
    assert "benchmark.profile.points" in str(e.value) and "(1, 4)" in str(e.value), str(e.value)


def test_a_role_without_servers_is_named_with_the_topology_s_roles() -> None:
    settings = ProfileSettings.model_validate({"points": [4], "roles": ["decode", "aggregated"]})
    settings.check_roles(["prefill", "decode", "aggregated"])  # every role served: no error
    with pytest.raises(ValueError) as e:
        settings.check_roles(["aggregated"])  # aggregated_only: no decode servers
    assert str(e.value) == (
        "benchmark.profile.roles: no server of role decode in this topology (its servers' roles: aggregated)"
    )


@pytest.mark.parametrize(
    ("recipe", "sets", "role", "has"),
    [
        # Aggregated serving only: prefill and decode state a GPU count, no servers.
        ("tiny-fp32-cpu-nixl-1p2d-vs-agg", ["topology.aggregated_only=true"], "decode", "aggregated"),
        ("tiny-fp32-cpu-nixl-1p1d", [], "aggregated", "prefill, decode"),  # no aggregated baseline
    ],
)
def test_a_profiled_role_without_servers_is_a_loader_error(recipe: str, sets: list[str], role: str, has: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe, [*sets, f"benchmark.profile={{points: [4], roles: [{role}]}}"])
    assert e.value.key == "benchmark.profile.roles", str(e.value)
    assert f"no server of role {role} in this topology (its servers' roles: {has})" in str(e.value), str(e.value)


def test_the_aggregated_baseline_may_be_profiled() -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg", ["benchmark.profile={points: [4], roles: [aggregated, decode]}"])
    assert rr.recipe.benchmark.profile is not None and rr.recipe.benchmark.profile.roles == ["aggregated", "decode"]


def test_the_profilers_kind_and_directory_are_pdbench_s() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p1d", ["benchmark.profile={points: [4], profiler_config: {profiler: cuda}}"])
    assert "benchmark.profile.profiler_config" in str(e.value) and "profiler" in str(e.value)


def test_no_profile_leaves_the_servers_and_the_bench_config_as_they_were() -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d")
    assert rr.recipe.benchmark.profile is None
    assert "profile" not in json.loads(rr.recipe.benchmark.model_dump_json())
    assert all("--profiler-config" not in server_argv(rr, w) for w in plan(rr).workers)


# --- rendering ---------------------------------------------------------------------------


def _words(rr: ResolvedRecipe, role: str) -> list[str]:
    (w,) = [w for w in plan(rr).workers if w.role == role]
    return [concrete(x) for x in server_argv(rr, w)]


def test_torch_profiles_render_the_flag_only_for_the_chosen_roles() -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", ["benchmark.profile={points: [4], roles: [decode]}"])
    decode, prefill = _words(rr, "decode"), _words(rr, "prefill")
    assert "--profiler-config" not in prefill
    assert decode[:2] == ["vllm", "serve"]  # no wrapper with torch
    cfg = json.loads(decode[decode.index("--profiler-config") + 1])
    # concrete() puts /run for ${RUN_DIR}: an absolute directory under the run directory, as vLLM asks.
    assert cfg == {"profiler": "torch", "torch_profiler_dir": "/run/profiles/.capture/decode-0"}
    assert cfg["torch_profiler_dir"] == f"/run/{capture_dir('decode-0')}"


def test_nsys_wraps_the_profiled_server_as_srt_slurm_does(tmp_path: Path) -> None:
    rr = load_recipe(
        "dsr1-fp8-h200-nixl-1p2d",
        ["benchmark.profile={points: [8], roles: [prefill], tool: nsys, nsys_args: [--stats=false]}"],
        cluster="example-h200-nixl",
    )
    workers = plan(rr).workers
    prefill = [w for w in workers if w.role == "prefill"]
    for w in workers:
        words = [concrete(x) for x in server_argv(rr, w)]
        if w.role != "prefill":
            assert words[:2] == ["vllm", "serve"] and "--profiler-config" not in words
            continue
        serve = words.index("vllm")
        wrap, line = words[:serve], words[serve:]
        where = f"/run/profiles/.capture/{w.name}"
        # The output directory made first (nsys does not make it), then nsys exec'd with the server.
        assert wrap[:4] == ["sh", "-c", 'mkdir -p "$0" && exec "$@"', where]
        nsys = wrap[4:]
        assert nsys[:2] == ["nsys", "profile"]
        pairs = dict(itertools.pairwise(nsys))
        assert pairs["-t"] == "cuda,nvtx" and pairs["-c"] == "cudaProfilerApi"
        assert pairs["--capture-range-end"] == "repeat"  # one report per profiled point
        assert pairs["-o"] == f"{where}/{w.name}" and nsys[-2] == "-o"
        assert "--cuda-graph-trace=node" in nsys and "--trace-fork-before-exec=true" in nsys
        assert nsys.index("--stats=false") < nsys.index("-o")  # the user's arguments before -o
        assert line[:2] == ["vllm", "serve"]
        assert json.loads(line[line.index("--profiler-config") + 1]) == {"profiler": "cuda"}
    assert prefill
    # The rendered node script carries the wrap, and bash reads it.
    out = tmp_path / "job"
    out.mkdir()
    render_job(rr, out, CTX)
    script = (out / "server.sh").read_text()
    assert script.count("nsys profile") == len(prefill) and "--capture-range-end repeat" in script
    assert '"${RUN_DIR}/profiles/.capture/prefill-0/prefill-0"' in script
    r = subprocess.run(["bash", "-n", str(out / "server.sh")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    if (exe := shutil.which("shellcheck")) is not None:
        r = subprocess.run([exe, "-x", str(out / "server.sh")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout


@pytest.mark.parametrize(
    "profile",
    [
        "{points: [4], profiler_config: {torch_profiler_with_stack: false, torch_profiler_use_gzip: false}}",
        "{points: [4], tool: nsys}",
    ],
)
def test_vllm_s_parser_accepts_the_rendered_profiler_flags(profile: str) -> None:
    require_vllm()
    from harness.render.vllm_flags import check_many

    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", [f"benchmark.profile={profile}"])
    lines = serve_lines(rr, plan(rr))
    assert all("--profiler-config" in argv for _, argv, _ in lines)  # past the nsys words: vllm serve's own
    assert check_many([a for _, a, _ in lines], [o for _, _, o in lines]) == []


def test_vllm_s_parser_names_a_misspelt_profiler_key() -> None:
    require_vllm()
    from harness.render.vllm_flags import check_many

    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d", ["benchmark.profile={points: [4], profiler_config: {torch_profiler_with_stak: 1}}"]
    )
    lines = serve_lines(rr, plan(rr))
    problems = [str(p) for p in check_many([a for _, a, _ in lines], [o for _, _, o in lines])]
    assert problems and all("torch_profiler_with_stak" in p and "benchmark.profile" in p for p in problems), problems


# --- PointProfiler against servers with vLLM's endpoints ---------------------------------


class _Server:
    """/start_profile and /stop_profile as vLLM's router answers them; on stop, `writes` the trace
    files into the capture directory (after `delay` s), or none."""

    def __init__(self, capture: Path, writes: list[str], delay: float = 0.0, mounted: bool = True) -> None:
        self.capture, self.writes, self.delay, self.mounted = capture, writes, delay, mounted
        self.calls: list[tuple[str, dict]] = []
        self.url = ""

    async def _start(self, request: web.Request) -> web.Response:
        self.calls.append(("start", await request.json()))
        return web.Response(status=200)

    async def _stop(self, request: web.Request) -> web.Response:
        self.calls.append(("stop", {}))
        await asyncio.sleep(self.delay)
        self.capture.mkdir(parents=True, exist_ok=True)
        for name in self.writes:
            (self.capture / name).write_text("{}")
        return web.Response(status=200)

    async def __aenter__(self) -> _Server:
        app = web.Application()
        if self.mounted:
            app.router.add_post("/start_profile", self._start)
            app.router.add_post("/stop_profile", self._stop)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def _settings(**kw: object) -> ProfileSettings:
    return ProfileSettings.model_validate({"points": [2], "stop_timeout_s": 5, "start_timeout_s": 5, **kw})


def test_traces_of_the_window_are_moved_to_the_point_per_instance(tmp_path: Path) -> None:
    async def go() -> None:
        old = tmp_path / capture_dir("decode-0") / "concurrency_1_rank0.1.pt.trace.json.gz"
        old.parent.mkdir(parents=True)
        old.write_text("{}")  # an earlier point's file stays where it is
        prefill = _Server(tmp_path / capture_dir("prefill-0"), ["concurrency_2_rank0.9.pt.trace.json.gz"])
        decode = _Server(
            tmp_path / capture_dir("decode-0"),
            ["concurrency_2_rank0.9.pt.trace.json.gz", "concurrency_2_rank0.profiler_out.txt"],
            delay=0.3,
        )
        async with prefill, decode:
            targets = [
                ("prefill-0", "prefill", prefill.url),
                ("decode-0", "decode", decode.url),
                ("proxy", "proxy", "http://127.0.0.1:9"),  # not a profiled role: never called
            ]
            profiler = PointProfiler(_settings(max_iterations=50), targets, tmp_path, "concurrency_2", print)
            await profiler.start()
            traces = await profiler.stop()
        assert prefill.calls[0] == ("start", {"profile_prefix": "concurrency_2", "max_iterations": 50})
        assert [c for c, _ in decode.calls] == ["start", "stop"]
        by = {t.instance: t for t in traces}
        assert set(by) == {"prefill-0", "decode-0"} and all(t.error is None for t in traces)
        assert by["decode-0"].files == [
            f"{point_dir('concurrency_2', 'decode-0')}/concurrency_2_rank0.9.pt.trace.json.gz",
            f"{point_dir('concurrency_2', 'decode-0')}/concurrency_2_rank0.profiler_out.txt",
        ]
        assert all((tmp_path / f).is_file() for t in traces for f in t.files)
        assert old.is_file() and not (tmp_path / point_dir("concurrency_2", "decode-0") / old.name).exists()

    asyncio.run(go())


def test_a_server_without_the_profiler_is_named_and_nothing_hangs(tmp_path: Path) -> None:
    async def go() -> None:
        async with _Server(tmp_path / capture_dir("decode-0"), [], mounted=False) as s:
            profiler = PointProfiler(_settings(), [("decode-0", "decode", s.url)], tmp_path, "concurrency_2", print)
            await profiler.start()
            (t,) = await profiler.stop()
        assert t.files == [] and t.error is not None and "404" in t.error and "without vLLM's profiler" in t.error

    asyncio.run(go())


def test_no_trace_written_ends_at_the_stop_bound_with_a_reason(tmp_path: Path) -> None:
    async def go() -> float:
        async with _Server(tmp_path / capture_dir("decode-0"), []) as s:
            settings = _settings(stop_timeout_s=1)
            profiler = PointProfiler(settings, [("decode-0", "decode", s.url)], tmp_path, "concurrency_2", print)
            await profiler.start()
            t0 = asyncio.get_running_loop().time()
            (t,) = await profiler.stop()
            took = asyncio.get_running_loop().time() - t0
        assert t.files == [] and t.error is not None
        assert t.error.startswith("no trace file in profiles/.capture/decode-0 within stop_timeout_s=1"), t.error
        return took

    assert asyncio.run(go()) < 3


def test_an_unconverted_nsys_stream_is_named_with_the_command_that_converts_it(tmp_path: Path) -> None:
    # An nsys without its importer leaves the raw stream and no .nsys-rep (docs/profiling.md).
    async def go() -> float:
        async with _Server(tmp_path / capture_dir("decode-0"), ["decode-0.1.qdstrm"]) as s:
            settings = _settings(tool="nsys", stop_timeout_s=1)
            profiler = PointProfiler(settings, [("decode-0", "decode", s.url)], tmp_path, "concurrency_2", print)
            await profiler.start()
            t0 = asyncio.get_running_loop().time()
            (t,) = await profiler.stop()
            took = asyncio.get_running_loop().time() - t0
        moved = f"{point_dir('concurrency_2', 'decode-0')}/decode-0.1.qdstrm"
        assert t.files == [moved] and (tmp_path / moved).is_file()  # moved like a trace
        assert t.error == (
            "stream not converted: nsys left decode-0.1.qdstrm and no .nsys-rep in profiles/.capture/decode-0 "
            f"within stop_timeout_s=1; convert with Nsight Systems' importer: QdstrmImporter -i {moved}"
        )
        return took

    assert asyncio.run(go()) < 3


def test_only_servers_of_the_profiled_roles_are_profiled() -> None:
    targets = [("decode-0", "decode", "u"), ("aggregated-0", "aggregated", "v"), ("proxy", "proxy", "w")]
    profiler = PointProfiler(_settings(roles=["aggregated"]), targets, Path("."), "c", print)
    assert [s.instance for s in profiler.servers] == ["aggregated-0"]
    assert PointProfiler(_settings(roles=["prefill"]), targets, Path("."), "c", print).servers == []


def test_perturbation_is_profiled_over_unprofiled() -> None:
    def fig(tput: float, ttft: float, tpot: float) -> WindowFigures:
        return WindowFigures(completed=8, failed=0, output_throughput=tput, median_ttft_ms=ttft, median_tpot_ms=tpot)

    assert perturbation(fig(80, 30, 12), fig(100, 20, 10)) == {
        "output_throughput": 0.8,
        "median_ttft_ms": 1.5,
        "median_tpot_ms": 1.2,
    }
    assert perturbation(fig(80, 30, 12), fig(100, 20, 0))["median_tpot_ms"] is None


def test_shlex_round_trip_of_the_rendered_torch_flag(tmp_path: Path) -> None:
    # The flag's JSON holds ${RUN_DIR}: a double-quoted word bash expands, JSON once expanded.
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", ["benchmark.profile={points: [4]}"])
    out = tmp_path / "job"
    out.mkdir()
    render_job(rr, out, CTX)
    line = next(x for x in (out / "server.sh").read_text().splitlines() if "--profiler-config" in x)
    word = line.split("--profiler-config", 1)[1].strip().rstrip("\\").strip()
    r = subprocess.run(
        ["bash", "-c", f"RUN_DIR=/r; printf %s {word}"], capture_output=True, text=True, timeout=30, check=True
    )
    assert json.loads(r.stdout)["torch_profiler_dir"].startswith("/r/profiles/.capture/"), shlex.quote(r.stdout)


# --- the sweep: which window is profiled, and what the result keeps ------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def test_the_second_window_alone_is_profiled_and_the_result_stays_unprofiled(model_dir: str, tmp_path: Path) -> None:
    srv = ProfiledFake(tmp_path / capture_dir("decode-0"))
    with srv:
        results = profiled_sweep(model_dir, tmp_path, srv)
    calls = srv.profile_calls
    assert [c for c, _, _ in calls] == ["start", "stop"] and calls[0][2] == {"profile_prefix": "concurrency_2"}
    assert "profile" not in results[1]
    r = results[2]
    # C=1: 1 warmup + N; C=2: 1 warmup, N measured, then N more between the start and the stop.
    assert len(srv.bodies) == (1 + PROFILE_PROMPTS) + (1 + PROFILE_PROMPTS + PROFILE_PROMPTS)
    c2 = range(1 + PROFILE_PROMPTS, len(srv.bodies))
    measured, profiled = list(c2)[1 : 1 + PROFILE_PROMPTS], list(c2)[1 + PROFILE_PROMPTS :]
    started, stopped = calls[0][1], calls[1][1]
    assert max(srv.ended[i] for i in measured) < started < min(srv.arrived[i] for i in profiled)
    assert max(srv.ended[i] for i in profiled) < stopped
    # Fresh prompts of the same shape: none of the measured ones again (the prefix cache).
    prompts = [srv.bodies[i]["prompt"] for i in measured], [srv.bodies[i]["prompt"] for i in profiled]
    assert not set(prompts[0]) & set(prompts[1])
    assert {srv.bodies[i]["max_tokens"] for i in c2} == {4}
    prof = r["profile"]
    assert prof["window"] == "second" and prof["errors"] == [] and r["completed"] == PROFILE_PROMPTS
    assert prof["unprofiled"]["median_ttft_ms"] == pytest.approx(r["median_ttft_ms"])
    assert prof["profiled"]["completed"] == PROFILE_PROMPTS and set(prof["perturbation"]) == {
        "output_throughput",
        "median_ttft_ms",
        "median_tpot_ms",
    }
    (server,) = prof["servers"]
    assert server == {
        "instance": "decode-0",
        "role": "decode",
        "files": ["profiles/concurrency_2/decode-0/concurrency_2_rank0.1.pt.trace.json.gz"],
        "error": None,
    }
    assert (tmp_path / server["files"][0]).is_file()


def test_without_perturbation_the_measured_window_itself_is_profiled(model_dir: str, tmp_path: Path) -> None:
    srv = ProfiledFake(tmp_path / capture_dir("decode-0"))
    with srv:
        results = profiled_sweep(model_dir, tmp_path, srv, perturbation=False)
    assert len(srv.bodies) == (1 + PROFILE_PROMPTS) * 2  # no second window
    measured = range(len(srv.bodies) - PROFILE_PROMPTS, len(srv.bodies))
    (start, t0, _), (stop, t1, _) = srv.profile_calls
    assert (start, stop) == ("start", "stop")
    assert t0 < min(srv.arrived[i] for i in measured) and max(srv.ended[i] for i in measured) < t1
    prof = results[2]["profile"]
    assert prof["window"] == "measured" and prof["unprofiled"] is None and prof["perturbation"] is None
    assert prof["profiled"]["median_ttft_ms"] == pytest.approx(results[2]["median_ttft_ms"])
    assert prof["servers"][0]["files"] == ["profiles/concurrency_2/decode-0/concurrency_2_rank0.1.pt.trace.json.gz"]


def test_a_server_without_the_profiler_costs_the_point_nothing(model_dir: str, tmp_path: Path) -> None:
    srv = ProfiledFake(tmp_path / capture_dir("decode-0"), mounted=False)
    with srv:
        results = profiled_sweep(model_dir, tmp_path, srv)
    r = results[2]
    assert r["completed"] == PROFILE_PROMPTS and r["failed"] == 0  # the point is kept
    (server,) = r["profile"]["servers"]
    assert server["files"] == [] and "404" in server["error"] and "without vLLM's profiler" in server["error"]
    # No profiler ran: no second window, whose figures would pass for the profiler's cost.
    assert len(srv.bodies) == (1 + PROFILE_PROMPTS) * 2
    assert r["profile"]["profiled"] is None and r["profile"]["perturbation"] is None
    assert r["profile"]["errors"] == ["not profiled: no server's profiler started"]


class _SlowStop(ProfiledFake):
    """A profiled server whose /stop_profile answers only once released (a trace written for
    minutes), bounded so that nothing outlives the test."""

    def __init__(self, capture: Path) -> None:
        super().__init__(capture)
        self.release = threading.Event()

    async def _stop_profile(self, request: web.Request) -> web.Response:
        self.profile_calls.append(("stop", time.perf_counter(), {}))
        deadline = time.monotonic() + 60
        while not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return web.Response(status=200)


class _CtrlCAtStart(ProfiledFake):
    """The target, profiled too: the profiled window's /start_profile brings a Ctrl-C (SIGINT to
    this process, as a terminal sends it) while the sweep waits for its answer."""

    async def _start_profile(self, request: web.Request) -> web.Response:
        os.kill(os.getpid(), signal.SIGINT)
        return await super()._start_profile(request)


def test_a_ctrl_c_in_the_profiled_window_waits_a_short_bound_for_traces(
    model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first Ctrl-C during the profiled window: the profilers' stop is bounded by
    INTERRUPT_PROFILE_STOP_S (shortened here to keep the test short), not stop_timeout_s; the
    section says the window was interrupted and whose traces came."""
    monkeypatch.setattr(stops, "INTERRUPT_PROFILE_STOP_S", 1.0)
    target, slow = _CtrlCAtStart(tmp_path / capture_dir("prefill-0")), _SlowStop(tmp_path / capture_dir("decode-0"))
    cfg = ClientConfig(
        base_url=target.base_url,
        model="tiny",
        tokenizer=model_dir,
        isl=16,
        osl=4,
        concurrency=[2, 4],
        num_prompts=PROFILE_PROMPTS,
        num_warmups=1,
        result_dir=str(tmp_path),
        health_check_interval_s=0,
        sentinels={"enabled": False},
        scrape=[f"prefill-0=prefill@{target.base_url}", f"decode-0=decode@{slow.base_url}"],
        profile={"points": [2], "roles": ["prefill", "decode"], "stop_timeout_s": 600},
    )
    with target, slow:
        t0 = time.monotonic()
        outcomes = run_sweep_detailed(cfg)
        took = time.monotonic() - t0
        answered = slow.release.is_set()
        slow.release.set()
    # The slow server was asked to stop and had not answered when the sweep ended.
    assert [c for c, _, _ in slow.profile_calls] == ["start", "stop"] and not answered
    assert took < 20, took  # 1 s for the traces, not stop_timeout_s=600
    assert [(o.concurrency, o.interrupted) for o in outcomes] == [(2, False), (4, True)]  # C=4 not run
    assert outcomes[0].path is not None
    result = json.loads(outcomes[0].path.read_text())
    assert result["completed"] == PROFILE_PROMPTS  # the measured window is the point's result, whole
    prof = result["profile"]
    by = {s["instance"]: s for s in prof["servers"]}
    assert by["prefill-0"]["files"] == ["profiles/concurrency_2/prefill-0/concurrency_2_rank0.1.pt.trace.json.gz"]
    assert by["prefill-0"]["error"] is None
    assert by["decode-0"]["files"] == [] and "within 1 s (interrupted by SIGINT (Ctrl-C))" in by["decode-0"]["error"]
    assert prof["errors"] == [
        f"the profiled window stopped: {INTERRUPTED}",
        f"{INTERRUPTED}: traces waited for 1 s at most, not stop_timeout_s=600; "
        "traces came from prefill-0, none from decode-0",
    ]
