"""What runs on every node of a job (`pdbench node`), under Slurm or the local launcher.

Node 0 runs prefill worker 0 and the proxy, health-gates the whole job, sends one
smoke request, runs the benchmark client and then tells the other nodes to stop.
Every node tears down all of its processes on success, failure, signal or timeout.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from harness.config.schema import TimeoutSpec
from harness.node import accuracy_step, kv_ceiling
from harness.node.affinity import pin_instance
from harness.node.coordination import Aborted, Coordination, discover_address
from harness.node.heartbeat import HostHeartbeat
from harness.node.log_error import first_error
from harness.node.node_checks import describe as describe_problems
from harness.node.node_checks import is_doctor_run, run_preflight
from harness.node.probes import is_healthy, smoke_request
from harness.node.secrets import ensure_job_secret
from harness.node.signal_cause import describe_signal
from harness.node.versions import record_servers
from harness.power.account import account as account_power
from harness.power.account import power_interval, power_required, wait_for_samplers
from harness.rundir import TIME_LIMIT_WARNING, Failure, ResultName, RunDir, write_status
from harness.rundir.paths import ARMS, REPEATS, WORKLOADS
from harness.supervisor import Supervisor
from harness.topology import (
    Phase,
    PlanFile,
    Process,
    arm_bench_name,
    arm_proxy_name,
    bench_name,
    proxy_name,
    workload_bench_name,
)
from harness.validity.scrape import scrape_all

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1
# A process seen stopped (SIGSTOP) this long is frozen: it answers nothing, and whatever waits on
# it (the client's requests, a health gate) would fail later in its name.
FROZEN_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


class Failed(Exception):
    """This node's part of the job failed; `failure` says where and why (see Failure.primary)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


class PhaseFailed(Failed):
    """A phase's sweep ended with failed or invalid points (or its accuracy gate failed) while its
    servers stayed up: a later phase may still run; the job fails."""


@dataclass
class NodeContext:
    run_dir: Path
    node_id: int
    plan: PlanFile

    @property
    def run(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def timeouts(self) -> TimeoutSpec:
        return self.plan.timeouts

    @property
    def is_head(self) -> bool:
        return self.node_id == self.plan.proxy_node

    def processes(self, node: int | None = None) -> list[Process]:
        return self.plan.processes_on(node)


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    # Ignore further signals at once: a second one must not cut the abort and teardown short.
    for sig in (*STOP_SIGNALS, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def run_node(run_dir: Path, node_id: int | None = None) -> int:
    run_dir = run_dir.resolve()
    run = RunDir(run_dir)
    plan = PlanFile.model_validate_json(run.plan.read_text())
    if node_id is None:
        node_id = int(os.environ.get("SLURM_NODEID", os.environ.get("SLURM_PROCID", "0")))
    if not 0 <= node_id < plan.num_nodes:
        log.error("node id %d is outside this job's %d nodes", node_id, plan.num_nodes)
        return EXIT_FAILED
    ctx = NodeContext(run_dir, node_id, plan)
    run.logs.mkdir(exist_ok=True)
    handler = logging.FileHandler(run.log(f"node{node_id}"))
    handler.setFormatter(logging.Formatter(f"%(asctime)s node{node_id} %(levelname)s %(message)s"))
    logging.getLogger("harness").addHandler(handler)  # every harness module logging on this node
    coord = Coordination(run_dir, node_id, plan.num_nodes)
    sup = Supervisor(
        run.logs,
        record=run.proc_record(node_id),
        adopt_orphans=True,
        reaper=True,
        reaper_args=(str(run_dir), str(node_id)),
    )
    # SIGUSR2: Slurm's warning before the time limit (#SBATCH --signal=USR2@<s>): stop while
    # there is time to tear down and record, instead of depending on KillWait after SIGTERM.
    for sig in (*STOP_SIGNALS, signal.SIGUSR2):
        signal.signal(sig, _raise_interrupted)

    rc, failure = EXIT_OK, None
    try:
        _run(ctx, coord, sup)
    except Interrupted as e:
        rc = 128 + e.signum
        # A node told to stop because another one failed must not bury that failure: the
        # failing node (or the launcher) records it before any other node is signalled.
        if e.signum == signal.SIGUSR2:
            failure = Failure(node_id, TIME_LIMIT_WARNING)
        elif not coord.has_failed():
            failure = Failure(node_id, describe_signal(e.signum))
    except Aborted as e:
        # Slurm warns every task of the time limit; a node that saw another node's warning
        # before its own stops for the same reason and says so in its exit code.
        cause = coord.root_cause()
        rc = 128 + signal.SIGUSR2 if cause is not None and cause.cause == TIME_LIMIT_WARNING else EXIT_FAILED
        log.info("stopping: %s", e)
    except Failed as e:
        rc, failure = EXIT_FAILED, e.failure
    except (TimeoutError, OSError, RuntimeError) as e:
        rc, failure = EXIT_FAILED, Failure(node_id, str(e))
    except Exception as e:
        log.exception("node %d: unexpected error", node_id)
        rc, failure = EXIT_FAILED, Failure(node_id, f"unexpected {type(e).__name__}: {e}")
    finally:
        # A second signal during teardown must not cut it short.
        for sig in (*STOP_SIGNALS, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        if failure is not None:
            coord.record_failure(failure)  # first, so the other nodes stop now
        # A client still running is stopped as by Ctrl-C first, while the servers still answer:
        # it writes its running point as interrupted instead of losing it to SIGTERM.
        for name in [n for n in sup.procs if n.split("-")[0] == "bench"]:
            sup.interrupt(name, ctx.timeouts.teardown_s / 2)
        sup.stop_all(ctx.timeouts.teardown_s)
        sup.close()
    if rc == EXIT_OK:
        log.info("node %d finished", node_id)
    else:
        log.error("node %d failed: %s", node_id, failure.reason if failure else coord.abort_reason())
    if ctx.is_head:
        if rc != EXIT_OK and coord.root_cause() is None:
            # Only a consequence was seen here; the node with the cause records it before it
            # exits. Bounded well inside Slurm's KillWait.
            coord.settle(ctx.timeouts.settle_s)
        write_status(run, rc, coord.first_failure() if rc != EXIT_OK else None)
    coord.mark_exited(rc)
    return rc


def _run(ctx: NodeContext, coord: Coordination, sup: Supervisor) -> None:
    t = ctx.timeouts
    # Before any server starts: what would otherwise fail 10-20 minutes into loading a model.
    problems = run_preflight(ctx.plan, ctx.node_id, ctx.run_dir)
    if problems:
        raise Failed(Failure(ctx.node_id, describe_problems(problems)))
    interface = ctx.plan.preflight.node_interface
    addr = discover_address(interface)
    if ctx.plan.num_nodes > 1 and ipaddress.ip_address(addr).is_loopback and not os.environ.get("PDBENCH_NODE_ADDR"):
        # The other nodes could never reach this one: say so now, not after the health timeout.
        source = (
            f"network interface {interface!r} has"
            if interface
            else f"this node's host name {socket.gethostname()!r} resolves to"
        )
        raise Failed(
            Failure(
                ctx.node_id,
                f"{source} {addr}, a loopback address the other nodes cannot reach (fix /etc/hosts or DNS, "
                "name the interface in site.node_interface, or set PDBENCH_NODE_ADDR)",
            )
        )
    coord.announce(addr)
    addrs = coord.wait_for_nodes(t.rendezvous_s)
    where = f" (in a {os.environ['PDBENCH_CONTAINER']} container)" if os.environ.get("PDBENCH_CONTAINER") else ""
    log.info("node %d of %d at %s%s; all nodes: %s", ctx.node_id, ctx.plan.num_nodes, addr, where, addrs)
    if is_doctor_run(ctx.run_dir):
        # `pdbench doctor`: every node passed its checks and reached every other one; start nothing.
        if ctx.is_head:
            coord.mark_done()
        else:
            _wait(ctx, coord.is_done, t.rendezvous_s, "node 0's end of the checks", coord.check_abort)
        return

    env = dict(os.environ, PDBENCH_NODE_ADDR=addr, PDBENCH_NODE_ID=str(ctx.node_id), RUN_DIR=str(ctx.run_dir))
    env.update({f"PDBENCH_NODE_{i}_ADDR": a for i, a in addrs.items()})
    # The bundled connector's KV server serves only peers that prove this job's secret
    # (its secret_file, ${RUN_DIR}/state/kv_secret in the rendered kv-transfer-config).
    ensure_job_secret(ctx.run_dir)
    server_sh = str(ctx.run.server_script)

    def start(name: str) -> None:
        sup.start(name, ["bash", server_sh, "proc", name], env, cwd=ctx.run_dir)

    host = HostHeartbeat.from_env()
    phases = ctx.plan.job_plan().phases
    deferred: Failure | None = None
    for i, phase in enumerate(phases):
        last = i == len(phases) - 1
        try:
            _run_phase(ctx, coord, sup, phase, last, addrs, start, host)
        except PhaseFailed as e:
            # The sweep ran to its end with failed or invalid points: its servers are fine, so the
            # next phase (the aggregated baseline) still measures; the job fails at its end.
            if last:
                raise Failed(deferred or e.failure) from None
            log.warning("node %d: phase %s failed (%s); the next phase runs, the job then fails", ctx.node_id, phase, e)
            deferred = deferred or e.failure
        if not last:
            # Every process of this phase on this node ends (GPU memory, ports) before the
            # next phase's servers start here.
            log.info("node %d: phase %s done; stopping its processes", ctx.node_id, phase)
            sup.stop_all(ctx.timeouts.teardown_s)
    if deferred is not None:
        raise Failed(deferred)


def _run_phase(
    ctx: NodeContext,
    coord: Coordination,
    sup: Supervisor,
    phase: Phase,
    last: bool,
    addrs: dict[int, str],
    start: Callable[[str], None],
    host: HostHeartbeat,
) -> None:
    """One phase of the job: its servers and proxy up, health-gated; node 0 runs its client."""
    t = ctx.timeouts
    # A later router arm's process starts in its turn, after the sweep (_run_arms).
    mine = [p for p in ctx.processes(ctx.node_id) if p.phase == phase and p.arm is None]
    if len(ctx.plan.job_plan().phases) > 1:
        log.info("node %d: phase %s", ctx.node_id, phase)
    phase_started = time.time()
    for p in mine:
        start(p.name)
    # The GPU power sampler of a node with servers in this phase ticks through it, their loading
    # included; its end never fails the job (no telemetry is recorded as missing; a sampler that
    # stopped leaves a gap, judged per point by node 0's accounting).
    sampler = f"power-node{ctx.node_id}"
    interval = power_interval(ctx.run_dir)
    if mine and interval:
        argv = [
            "--run-dir",
            str(ctx.run_dir),
            "--node",
            str(ctx.node_id),
            "--phase",
            phase,
            "--interval",
            str(interval),
        ]
        sup.start(sampler, [sys.executable, "-m", "harness.power.sampler", *argv], dict(os.environ), cwd=ctx.run_dir)
    bench = bench_name(phase)

    def check(ignore: tuple[str, ...] = ()) -> None:
        ignore = (*ignore, sampler)
        dead = [d for d in sup.exited() if d[0] not in ignore]
        if dead:
            raise Failed(_exit_failure(ctx, *dead[0]))
        frozen = [n for n, s in sup.stopped().items() if s >= FROZEN_S and n not in ignore]
        if frozen:
            raise Failed(_process_failure(ctx, frozen[0], f"was stopped (SIGSTOP) for {FROZEN_S:.0f} s: frozen"))
        coord.check_abort()
        if (lost := host.lost()) is not None:
            raise Failed(Failure(ctx.node_id, lost))

    # Health gate: this node's servers first (and keep CPU-only ones on their cores), then node 0
    # waits for every server of the job and for the proxy's count-aware /health.
    # The proxy is gated with the job below: its /health waits for every remote server.
    own = {p.name: f"http://127.0.0.1:{p.port}/health" for p in mine if p.port and p.kind != "proxy"}
    _wait_healthy(ctx, own, t.health_s, check, primary=True)
    for p in mine:
        if p.cpu_bind:
            pin_instance(sup.procs[p.name].pid, p.cpu_bind)
    # What each server runs on, for every result's metadata (the client reads it).
    record_servers(ctx.run_dir, ctx.node_id, {p.name: sup.procs[p.name].pid for p in mine if p.kind == "server"})

    done = coord.is_done if last else (lambda: coord.is_phase_done(phase))
    if not ctx.is_head:
        log.info("node %d ready; waiting for the benchmark to finish", ctx.node_id)
        # Node 0 runs the job's client, then each workload's, each bounded by bench_s.
        clients = 1 + (len(ctx.plan.workloads) if phase == "disagg" else 0)
        bound = (
            t.health_s
            + t.smoke_s
            + kv_ceiling.TIMEOUT_S
            + clients * t.bench_s
            + accuracy_step.bound_s(ctx.run_dir, phase)
        )
        # decode-0's node on another host than prefill-0's listens for node 0's measured transfer.
        with kv_ceiling.sink(ctx.run_dir, ctx.plan, ctx.node_id, addrs) if phase == "disagg" else nullcontext():
            _wait(ctx, done, bound, "the job's end" if last else f"the end of {phase}", check)
        return

    servers = [p for p in ctx.processes() if p.kind == "server" and p.phase == phase]
    job = {p.name: f"http://{addrs[p.node]}:{p.port}/health" for p in servers if p.name not in own}
    job.update({p.name: f"http://127.0.0.1:{p.port}/health" for p in mine if p.kind == "proxy"})
    # Another node's server is gated by its own node too, which records the cause if it fails;
    # what this gate sees is a consequence (settle() lets the cause win, or this stands).
    _wait_healthy(ctx, job, t.health_s, check, primary=False)
    log.info("every server and the proxy are ready")

    base = f"http://127.0.0.1:{ctx.plan.proxy_port}"
    try:
        text = smoke_request(base, ctx.plan.served_model_name, t.smoke_s)
    except (RuntimeError, OSError, TimeoutError) as e:
        check()  # a server that died is the cause, the failed request its echo
        raise Failed(Failure(ctx.node_id, str(e), primary=False)) from e
    log.info("smoke request through the proxy answered %r", text)

    # Before the sweep's /metrics baseline, so the eval's requests stay out of its deltas.
    if accuracy := accuracy_step.before_sweep(ctx.run_dir, phase):
        raise Failed(Failure(ctx.node_id, "; ".join(accuracy)))
    if phase == "disagg":
        # The rate the KV's path could have, between prefill's and decode's devices, while they idle:
        # each point's achieved KV rate is judged against it (validity rule kv_transport).
        kv_ceiling.record(ctx.run_dir, ctx.plan, ctx.node_id, addrs)
    targets = {p.name: f"http://{addrs[p.node]}:{p.port}" for p in servers}
    metrics = ctx.run.metrics(phase)
    scrape_all(targets, metrics, "before")
    sampling = sorted({p.node for p in ctx.processes() if p.phase == phase}) if interval else []
    if late := wait_for_samplers(ctx.run_dir, sampling, phase):
        log.warning("no power sampler record from node(s) %s: their GPUs' points will say so", late)
    earlier = set(ctx.run.result_names())
    rc = _sweep(ctx, sup, start, bench, check)
    scrape_all(targets, metrics, "after")
    if rc == 0 and phase == "disagg" and ctx.plan.arms:
        rc, bench = _run_arms(ctx, sup, start, check, targets, bench)
    if rc == 0 and phase == "disagg" and ctx.plan.workloads:
        rc, bench = _run_workloads(ctx, sup, start, check, targets, bench)
    power = _account_power(ctx, phase, [f for f in ctx.run.results() if f.name not in earlier], phase_started)
    if phase == "disagg":  # each workload's points, into its own power/points/ (result names may repeat)
        for name in ctx.plan.workloads:
            where = ctx.run.workload(name)
            power += _account_power(ctx, phase, where.results(), phase_started, where)
    # Before the other nodes are told to stop: the eval needs this phase's servers.
    accuracy = accuracy_step.after_sweep(ctx.run_dir, phase) if rc == 0 else []
    if last:
        coord.mark_done()
    else:
        coord.mark_phase_done(phase)
    if rc != 0:
        raise PhaseFailed(_exit_failure(ctx, bench, rc, primary=False))
    if accuracy:
        raise PhaseFailed(Failure(ctx.node_id, "; ".join(accuracy)))
    if power:
        raise PhaseFailed(
            Failure(ctx.node_id, "GPU power is required (benchmark.validity.require_power): " + "; ".join(power))
        )
    invalid = _invalid_points(ctx.run_dir)
    unverified = _unverified_points(ctx.run_dir)
    if unverified:  # kept, but collect leaves them out unless asked: say so where users look
        log.warning("result point(s) without validity evidence (no server /metrics): %s", ", ".join(unverified))
    if invalid:
        raise PhaseFailed(Failure(ctx.node_id, "invalid result point(s): " + "; ".join(invalid)))


def _sweep(ctx: NodeContext, sup: Supervisor, start: Callable[[str], None], bench: str, check, *ignore: str) -> int:
    """Run one client to its end (bounded by timeouts.bench_s); its exit code."""
    t = ctx.timeouts
    start(bench)
    deadline = time.monotonic() + t.bench_s
    while (rc := sup.procs[bench].popen.poll()) is None:
        check(ignore=(bench, *ignore))
        if time.monotonic() > deadline:
            raise Failed(
                Failure(ctx.node_id, f"the benchmark did not finish within {t.bench_s:.0f} s (partial results kept)")
            )
        time.sleep(0.5)
    if rc != 0:
        check(ignore=(bench, *ignore))  # a server or the proxy that died first is the cause
    return rc


def _run_arms(
    ctx: NodeContext, sup: Supervisor, start: Callable[[str], None], check, targets: dict[str, str], bench: str
) -> tuple[int, str]:
    """Each later router arm in turn over the same servers (proxy.arms): the router before it stopped
    (its port free), this one started, health-gated and smoke-tested, the whole sweep measured into
    arms/<arm>/ with its own /metrics before and after, and it stays up until the next arm's turn.
    Returns the first failing client's exit code and name (0 and the last client's when all passed)."""
    t, done = ctx.timeouts, [bench]
    previous = proxy_name("disagg")
    for arm in ctx.plan.arms:
        router, client = arm_proxy_name(arm), arm_bench_name(arm)
        log.info("router arm %s: stopping %s, starting %s", arm, previous, router)
        sup.stop(previous, t.teardown_s)
        where = ctx.run.arm(arm)
        where.path.mkdir(parents=True, exist_ok=True)
        start(router)
        finished = tuple(done)  # the clients that ended before this arm: not a failure
        url = f"http://127.0.0.1:{ctx.plan.proxy_port}/health"
        _wait_healthy(ctx, {router: url}, t.health_s, functools.partial(check, ignore=finished), primary=False)
        try:
            text = smoke_request(f"http://127.0.0.1:{ctx.plan.proxy_port}", ctx.plan.served_model_name, t.smoke_s)
        except (RuntimeError, OSError, TimeoutError) as e:
            check(ignore=finished)
            raise Failed(Failure(ctx.node_id, f"router arm {arm}: {e}", primary=False)) from e
        log.info("router arm %s: smoke request answered %r", arm, text)
        scrape_all(targets, where.metrics(), "before")
        rc = _sweep(ctx, sup, start, client, check, *done)
        scrape_all(targets, where.metrics(), "after")
        if rc != 0:
            return rc, client
        done.append(client)
        previous = router
    return 0, done[-1]


def _run_workloads(
    ctx: NodeContext, sup: Supervisor, start: Callable[[str], None], check, targets: dict[str, str], bench: str
) -> tuple[int, str]:
    """Each workload in recipe order over the same servers and router (benchmark.workloads): its own
    client measures its sweep into workloads/<name>/ with its own /metrics before and after.
    Returns the first failing client's exit code and name (0 and the last client's when all passed)."""
    done = [bench]
    for name in ctx.plan.workloads:
        client, where = workload_bench_name(name), ctx.run.workload(name)
        log.info("workload %s: starting %s", name, client)
        where.path.mkdir(parents=True, exist_ok=True)
        scrape_all(targets, where.metrics(), "before")
        rc = _sweep(ctx, sup, start, client, check, *done)  # the clients that ended before: not a failure
        scrape_all(targets, where.metrics(), "after")
        if rc != 0:
            return rc, client
        done.append(client)
    return 0, done[-1]


def _account_power(
    ctx: NodeContext, phase: Phase, results: list[Path], started: float, into: RunDir | None = None
) -> list[str]:
    """Each point's energy and cost, and the phase's power package, while the samplers still tick
    (`into`: where a workload's records go, its folder). Power never fails the job unless the recipe
    requires it (benchmark.validity.require_power): then the points without valid power are
    returned, each with why."""
    if not results:
        return []
    required = power_required(ctx.run_dir)
    try:
        points = account_power(ctx.run_dir, ctx.plan, phase, results, started, into)
    except Exception as e:
        log.exception("power accounting of phase %s failed; its points have no energy record", phase)
        return [f"the power accounting of phase {phase} failed: {type(e).__name__}: {e}"] if required else []
    for p in points:
        verdict = (
            "valid" if p.power_valid else ("missing: " + (p.missing or "")) if p.power_valid is None else "invalid"
        )
        log.info(
            "power %s: %s%s", p.result, verdict, "" if p.power_valid is not False else f" ({'; '.join(p.reasons)})"
        )
    if not required:
        return []
    return [
        f"{p.result}: " + (f"missing ({p.missing})" if p.power_valid is None else f"invalid ({'; '.join(p.reasons)})")
        for p in points
        if p.power_valid is not True
    ]


def _point_results(run_dir: Path) -> list[tuple[str, Path]]:
    """(name, file) of every point's result: the sweep's at the top, then an SLO search's repeats
    under repeats/<k>/, the router arms' and the workloads' (named by their path in the run, as
    their file names may repeat the sweep's)."""
    run = RunDir(run_dir)
    repeats = sorted((run_dir / REPEATS).glob(f"*/{ResultName.GLOB}"))
    arms = sorted((run_dir / ARMS).glob(f"*/{ResultName.GLOB}"))  # router arms' (proxy.arms)
    workloads = sorted((run_dir / WORKLOADS).glob(f"*/{ResultName.GLOB}"))  # benchmark.workloads'
    later = repeats + arms + workloads
    return [(f.name, f) for f in run.results()] + [(str(f.relative_to(run_dir)), f) for f in later]


def _invalid_points(run_dir: Path) -> list[str]:
    """Points whose result says they did not measure disaggregated serving (metadata.valid)."""
    out = []
    for name, f in _point_results(run_dir):
        try:
            meta = json.loads(f.read_text()).get("metadata") or {}
        except (OSError, ValueError):
            out.append(f"{name}: unreadable")
            continue
        if meta.get("valid") is False:
            reasons = (meta.get("validity") or {}).get("reasons") or ["no reason recorded"]
            out.append(f"{name}: {', '.join(reasons)}")
    return out


def _unverified_points(run_dir: Path) -> list[str]:
    """Points whose validity rules had no server metrics to judge (metadata.valid is null)."""
    out = []
    for name, f in _point_results(run_dir):
        try:
            meta = json.loads(f.read_text()).get("metadata") or {}
        except (OSError, ValueError):
            continue
        if (meta.get("validity") or {}).get("verdict") == "unverified":
            out.append(name)
    return out


def _exit_failure(ctx: NodeContext, name: str, code: int, primary: bool = True) -> Failure:
    """Names the node, the role and the end of the process's log, so the run directory says why."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return _process_failure(ctx, name, how, primary)


def _process_failure(ctx: NodeContext, name: str, how: str, primary: bool = True) -> Failure:
    kind = next((p.kind for p in ctx.processes() if p.name == name), "benchmark client")
    role = name.split("-")[0] if kind in ("server", "follower") else kind
    return Failure(
        ctx.node_id,
        how,
        process=name,
        role=role,
        log=ctx.run.relative(ctx.run.log(name)),
        log_tail=_log_tail(ctx.run.log(name)),
        log_error=first_error(ctx.run.log(name)),
        primary=primary,
    )


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return "  (no log)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:])


def _wait_healthy(ctx: NodeContext, urls: dict[str, str], timeout: float, check, primary: bool) -> None:
    pending = dict(urls)
    deadline = time.monotonic() + timeout
    while pending:
        check()
        for name, url in list(pending.items()):
            if is_healthy(url):
                log.info("%s is healthy", name)
                del pending[name]
        if pending and time.monotonic() > deadline:
            names = sorted(pending)
            cause = f"not healthy within {timeout:.0f} s: {', '.join(names)}"
            mine = [p for p in ctx.processes(ctx.node_id) if p.name in names]
            if len(names) == 1 and mine:  # the one process of this node that is stuck: its log says why
                name, kind = names[0], mine[0].kind
                role = name.split("-")[0] if kind in ("server", "follower") else kind
                raise Failed(
                    Failure(
                        ctx.node_id,
                        f"was not healthy within {timeout:.0f} s",
                        process=name,
                        role=role,
                        log=ctx.run.relative(ctx.run.log(name)),
                        log_tail=_log_tail(ctx.run.log(name)),
                        log_error=first_error(ctx.run.log(name)),
                        primary=primary,
                    )
                )
            raise Failed(Failure(ctx.node_id, cause, primary=primary))
        if pending:
            time.sleep(1.0)


def _wait(ctx: NodeContext, pred, timeout: float, what: str, check) -> None:
    deadline = time.monotonic() + timeout
    while True:
        check()
        if pred():
            check()  # a process that died before the job's end is still this node's failure
            return
        if time.monotonic() > deadline:
            raise Failed(Failure(ctx.node_id, f"{what} did not come within {timeout:.0f} s"))
        time.sleep(0.5)


def main(run_dir: str) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s pdbench-node[%(process)d] %(levelname)s %(message)s"
    )
    sys.exit(run_node(Path(run_dir)))
