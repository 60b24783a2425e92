"""Run the external clients a sweep asks for, one concurrency point at a time.

Each point is one child process in its own session, its output in the run directory's
logs/<client>-conc_<C>.log and its command line in its point directory; it is waited for
within the client's timeout_s, and on a timeout or Ctrl-C its whole process group is stopped
(SIGTERM, then SIGKILL) and reaped, so nothing outlives `pdbench bench`. A point directory that
exists already is never written over: with --resume a finished one is kept and an unfinished one
moved to superseded/ first, as pdbench's own results are.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness import atomic
from harness.bench.client_config import ClientConfig
from harness.bench.external.aiperf_command import aiperf_argv
from harness.bench.external.vllm_command import vllm_argv
from harness.rundir.paths import CLIENT_COMMAND, CLIENT_RUN, RunDir
from harness.supervisor import signal_group, stop_groups

STOP_GRACE_S = 10.0
SAMPLE_S = 1.0  # the client's CPU is read once a second
BUILDERS: dict[str, Callable[[ClientConfig, int, Path], list[str]]] = {"aiperf": aiperf_argv, "vllm": vllm_argv}


@dataclass(frozen=True)
class ExternalOutcome:
    client: str
    concurrency: int
    point_dir: Path
    returncode: int | None  # None: stopped at its timeout
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def summary(self) -> str:
        how = "timed out" if self.returncode is None else f"exited with code {self.returncode}"
        return f"{self.client} at C={self.concurrency} {how} (its output: {self.log})"


def phase_of(cfg: ClientConfig) -> str:
    """One aggregated server (gpus) or a disaggregated deployment: the directory names it."""
    return "aggregated" if cfg.gpus is not None else "disagg"


def clients_to_run(cfg: ClientConfig) -> list[str]:
    """The sweep's client if it is an external one, then the cross-checks, in that order."""
    main: list[str] = [cfg.client] if cfg.client != "pdbench" else []
    return main + list(cfg.cross_check)


def run_external_clients(cfg: ClientConfig) -> list[ExternalOutcome]:
    """Every external client at every concurrency of the sweep; a failed point does not stop the others."""
    run = RunDir(Path(cfg.result_dir))
    phase = phase_of(cfg)
    outcomes = []
    for client in clients_to_run(cfg):
        timeout = cfg.aiperf.timeout_s if client == "aiperf" else cfg.vllm_bench.timeout_s
        for c in cfg.concurrency:
            point = run.client_point(client, c, phase)
            if cfg.resume and (kept := _kept(run, client, c, phase)) is not None:
                outcomes.append(kept)
                continue
            point.mkdir(parents=True, exist_ok=False)  # never over an earlier run's artifacts
            argv = BUILDERS[client](cfg, c, point)
            atomic.write_text(point / CLIENT_COMMAND, shlex.join(argv) + "\n")
            log = run.client_log(client, c, phase)
            print(f"{client} at C={c}: {shlex.join(argv)}", file=sys.stderr, flush=True)
            t0, cpu0 = time.monotonic(), _children_cpu_s()
            timeline: list[tuple[float, float]] = []
            rc = run_bounded(argv, log, timeout, client_env(client, cfg), timeline)
            # The client's own CPU (its reaped processes) and, each second, its process tree's CPU
            # seconds so far: the report takes the share over the client's measured window (past its
            # start-up) to tell a CPU-bound client's TTFT from the servers'.
            atomic.write_json(
                point / CLIENT_RUN,
                {
                    "returncode": rc,
                    "wall_s": round(time.monotonic() - t0, 3),
                    "cpu_s": round(_children_cpu_s() - cpu0, 3),
                    "cpu_timeline": [[round(t, 2), round(c, 3)] for t, c in timeline],
                },
            )
            outcome = ExternalOutcome(client, c, point, rc, log)
            print(f"{client} at C={c}: {'done' if outcome.ok else outcome.summary}", file=sys.stderr, flush=True)
            outcomes.append(outcome)
    return outcomes


def _kept(run: RunDir, client: str, concurrency: int, phase: str) -> ExternalOutcome | None:
    """--resume: a point that finished (exit code 0) is kept; any other is moved to superseded/ so
    that it runs again. None: run the point."""
    point = run.client_point(client, concurrency, phase)
    if not point.exists():
        return None
    try:
        ok = json.loads((point / CLIENT_RUN).read_text())["returncode"] == 0
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if ok:
        print(f"{client} at C={concurrency}: kept ({point})", file=sys.stderr, flush=True)
        return ExternalOutcome(client, concurrency, point, 0, run.client_log(client, concurrency, phase))
    moved = run.superseded / f"{run.relative(point)}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    moved.parent.mkdir(parents=True, exist_ok=True)
    point.rename(moved)
    print(f"{client} at C={concurrency}: its unfinished run moved to {moved}", file=sys.stderr, flush=True)
    return None


def client_env(client: str, cfg: ClientConfig) -> dict[str, str]:
    """The job's environment, less what breaks the client: aiperf 0.13.0 in HF offline mode looks a
    tokenizer up in the hub's cache only, so a local tokenizer directory (which needs no hub) fails."""
    env = dict(os.environ)
    if client == "aiperf" and Path(cfg.tokenizer).is_dir():
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            env.pop(name, None)
    return env


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds of a process, the children it reaped and its live descendants."""
    total = 0.0
    try:
        t = root.cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
    except psutil.Error:
        pass
    return total


def run_bounded(
    argv: list[str],
    log: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    timeline: list[tuple[float, float]] | None = None,
) -> int | None:
    """Run argv with its output appended to log; its exit code, or None if it ran past timeout_s.
    `timeline` gets (seconds since start, CPU seconds of its process tree) once a second."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as e:  # not installed, not executable: said in its log, as a failed run
            out.write(f"cannot run {argv[0]}: {e.strerror or e}\n".encode())
            return 127
    start = time.monotonic()
    deadline = start + timeout_s
    tree = psutil.Process(proc.pid)
    try:
        while True:
            if timeline is not None and (cpu := _tree_cpu_s(tree)) > 0:
                timeline.append((time.monotonic() - start, cpu))
            try:
                return proc.wait(timeout=max(0.0, min(SAMPLE_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    return None
    finally:
        # A timeout, a Ctrl-C or a normal exit: the group (its workers too) is gone and reaped.
        stop_groups([proc], STOP_GRACE_S)
        signal_group(proc.pid, signal.SIGKILL)  # a worker left behind by a client that exited
