"""PD proxy overhead: pdbench's proxy against vllm-router and vLLM's NIXL toy proxy.

Zero-delay mock prefill and decode engines (`pdbench mock-engine`), one client process,
streamed completions of 64 tokens, concurrency 1, 16 and 64. For every target the
client measures end-to-end latency and requests per second; "added" latency is a
proxy's median (p99) minus the median (p99) of sending the same requests straight to
the decode engine. All targets run in the same invocation, interleaved over rounds so
that machine drift hits them alike. Each target's own CPU time per request (its process
tree, from /proc) is printed too: unlike latency, it hardly moves with other load.

    .venv/bin/python benchmarks/bench_proxy.py [--seconds 2] [--rounds 5] \\
        [--toy-proxy /tmp/peers/toy_proxy_server.py] [--json out.json]

Peers:
- vllm-router: the `vllm-router` executable (PyPI `vllm-router`, Rust), run with
  `--vllm-pd-disaggregation --prefill URL --decode URL --policy round_robin`.
- vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): give
  a copy with --toy-proxy (kept outside this repository). Without one, the script
  runs `toy_equivalent`, a re-implementation of the same flow on the same stack
  (FastAPI, httpx, uvicorn), and says so in the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.common import free_port  # noqa: E402

PROMPT = " ".join(["benchmark"] * 128)
BODY = {"model": "mock", "prompt": PROMPT, "max_tokens": 64, "stream": True, "ignore_eos": True}


@dataclass
class Proc:
    name: str
    argv: list[str]
    port: int
    log: Path
    popen: subprocess.Popen | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        out = open(self.log, "wb")  # noqa: SIM115 - the server writes to it until stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        out.close()

    def stop(self) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)


def cpu_seconds(proc: Proc | None) -> float:
    """User + system CPU time of a target's process tree (0 for the direct baseline)."""
    import psutil

    if proc is None or proc.popen is None:
        return 0.0
    try:
        root = psutil.Process(proc.popen.pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
        return total
    except psutil.Error:
        return float("nan")


@dataclass
class Result:
    target: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    errors: int = 0
    cpu_s: float = 0.0  # the target's own CPU time over the run (warm-up included)
    sent: int = 0  # requests completed in that time, warm-up included

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.sent * 1e6 if self.sent else float("nan")

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


async def run_load(url: str, concurrency: int, seconds: float, warmup_s: float) -> tuple[list[float], float, int, int]:
    """One client: `concurrency` loops sending streamed completions; latencies after warm-up."""
    import aiohttp

    body = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json"}
    lat: list[float] = []
    errors = 0
    sent = 0
    conn = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        t_begin = time.perf_counter()
        t_measure = t_begin + warmup_s
        t_end = t_measure + seconds

        async def worker() -> None:
            nonlocal errors, sent
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                try:
                    async with s.post(url, data=body, headers=headers) as r:
                        data = await r.read()
                        ok = r.status == 200 and data.endswith(b"data: [DONE]\n\n")
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                t1 = time.perf_counter()
                sent += ok
                if t0 >= t_measure and t1 <= t_end:
                    if ok:
                        lat.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, seconds, errors, sent


def wait_ready(url: str, timeout: float, proc: Proc) -> None:
    import urllib.request

    body = json.dumps({**BODY, "stream": False, "max_tokens": 2}).encode()
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.popen is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited early; see {proc.log}")
        try:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} not ready after {timeout}s ({last}); see {proc.log}")


# -- a re-implementation of the toy proxy's flow, used only without --toy-proxy ------------


def toy_equivalent(port: int, prefill: str, decode: str) -> None:
    """FastAPI + httpx, serial legs, StreamingResponse: the toy proxy's stack and flow."""
    import itertools
    import uuid

    import httpx
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    clients: dict[str, httpx.AsyncClient] = {}
    rr = {"p": itertools.cycle([prefill]), "d": itertools.cycle([decode])}

    def client(base: str) -> httpx.AsyncClient:
        if base not in clients:
            clients[base] = httpx.AsyncClient(timeout=None, base_url=base + "/v1", limits=limits)
        return clients[base]

    async def handle(api: str, request: Request) -> StreamingResponse:
        data = await request.json()
        rid = str(uuid.uuid4())
        headers = {"X-Request-Id": rid}
        p = dict(
            data,
            kv_transfer_params={
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
            stream=False,
            max_tokens=1,
        )
        p.pop("stream_options", None)
        resp = await client(next(rr["p"])).post(api, json=p, headers=headers)
        resp.raise_for_status()
        await resp.aread()
        kv = resp.json().get("kv_transfer_params")
        if kv:
            data["kv_transfer_params"] = kv
        dec = client(next(rr["d"]))

        async def gen():  # type: ignore[no-untyped-def]
            async with dec.stream("POST", api, json=data, headers=headers) as r:
                r.raise_for_status()
                async for chunk in r.aiter_bytes():
                    yield chunk

        return StreamingResponse(gen(), media_type="application/json")

    async def completions(request):  # type: ignore[no-untyped-def]
        return await handle("/completions", request)

    # Set at run time: this module's string annotations cannot name a local import.
    completions.__annotations__ = {"request": Request}
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- orchestration -----------------------------------------------------------------------


def targets(args: argparse.Namespace, tmp: Path, p_url: str, d_url: str) -> dict[str, Proc | None]:
    py = sys.executable
    out: dict[str, Proc | None] = {"direct": None}
    port = free_port()
    argv = [
        py,
        "-m",
        "harness",
        "proxy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prefill",
        p_url,
        "--decode",
        d_url,
    ]
    if args.workers > 1:
        argv += ["--workers", str(args.workers)]
    out["pdbench"] = Proc("pdbench", argv, port, tmp / "pdbench.log")
    router = shutil.which("vllm-router") or str(Path(py).parent / "vllm-router")
    if Path(router).exists():
        port = free_port()
        out["vllm-router"] = Proc(
            "vllm-router",
            [
                router,
                "--vllm-pd-disaggregation",
                "--prefill",
                p_url,
                "--decode",
                d_url,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                "round_robin",
                "--log-level",
                "warning",
            ],
            port,
            tmp / "router.log",
        )
    else:
        print("vllm-router not installed (pip install vllm-router): skipped", file=sys.stderr)
    port = free_port()
    if args.toy_proxy:
        out["toy-proxy"] = Proc(
            "toy-proxy",
            [
                py,
                str(Path(args.toy_proxy).resolve()),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prefiller-host",
                "127.0.0.1",
                "--prefiller-port",
                p_url.rsplit(":", 1)[1],
                "--decoder-host",
                "127.0.0.1",
                "--decoder-port",
                d_url.rsplit(":", 1)[1],
            ],
            port,
            tmp / "toy.log",
        )
    else:
        out["toy-equivalent"] = Proc(
            "toy-equivalent",
            [py, str(Path(__file__).resolve()), "--serve-toy", str(port), p_url, d_url],
            port,
            tmp / "toy.log",
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per target, concurrency and round")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1, help="pdbench proxy --workers")
    ap.add_argument("--toy-proxy", help="path to a copy of vLLM's toy_proxy_server.py (outside this repo)")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--serve-toy", nargs=3, metavar=("PORT", "PREFILL", "DECODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_toy:
        toy_equivalent(int(args.serve_toy[0]), args.serve_toy[1], args.serve_toy[2])
        return 0
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="pdbench-bench-proxy-"))
    py = sys.executable
    engines = []
    for role in ("prefill", "decode"):
        port = free_port()
        engines.append(
            Proc(
                role,
                [
                    py,
                    "-m",
                    "harness",
                    "mock-engine",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--role",
                    role,
                    "--model",
                    "mock",
                ],
                port,
                tmp / f"{role}.log",
            )
        )
    p_url, d_url = (f"http://127.0.0.1:{e.port}" for e in engines)
    procs = targets(args, tmp, p_url, d_url)
    results: dict[tuple[str, int], Result] = {}
    try:
        for e in engines:
            e.start()
        for e in engines:
            wait_ready(f"http://127.0.0.1:{e.port}/v1/completions", 60, e)
        for proc in procs.values():
            if proc is not None:
                proc.start()
        for proc in procs.values():
            if proc is not None:
                wait_ready(f"http://127.0.0.1:{proc.port}/v1/completions", 60, proc)
        names = list(procs)
        for rnd in range(args.rounds):
            for c in concurrencies:
                order = names if rnd % 2 == 0 else names[::-1]
                for name in order:
                    proc = procs[name]
                    port = proc.port if proc is not None else engines[1].port
                    cpu0 = cpu_seconds(proc)
                    lat, secs, errs, sent = asyncio.run(
                        run_load(f"http://127.0.0.1:{port}/v1/completions", c, args.seconds, args.warmup)
                    )
                    r = results.setdefault((name, c), Result(name, c))
                    r.cpu_s += cpu_seconds(proc) - cpu0
                    r.sent += sent
                    r.latencies += lat
                    r.elapsed += secs
                    r.errors += errs
                    print(f"round {rnd + 1} c={c:<3} {name:<15} {len(lat) / secs:8.1f} req/s", file=sys.stderr)
    finally:
        for proc in procs.values():
            if proc is not None:
                proc.stop()
        for e in engines:
            e.stop()
    report(results, concurrencies, list(procs), args)
    return 0


def report(
    results: dict[tuple[str, int], Result], concurrencies: list[int], names: list[str], args: argparse.Namespace
) -> None:
    ms = 1000.0
    print(
        f"\nPD proxy overhead: zero-delay mock engines, {BODY['max_tokens']}-token streams, "
        f"{args.rounds} x {args.seconds:g} s per point, one client, {os.cpu_count()} CPUs"
    )
    print(
        f"{'conc':>4}  {'target':<15} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} "
        f"{'cpu us/req':>10} {'errors':>6}"
    )
    table: list[dict[str, Any]] = []
    for c in concurrencies:
        base = results[("direct", c)]
        for name in names:
            r = results[(name, c)]
            add50 = (r.pct(50) - base.pct(50)) * ms
            add99 = (r.pct(99) - base.pct(99)) * ms
            cpu = f"{r.cpu_us_per_request:10.0f}" if name != "direct" else f"{'-':>10}"
            print(
                f"{c:>4}  {name:<15} {r.rps:8.1f} {r.pct(50) * ms:8.2f} {r.pct(99) * ms:8.2f} "
                f"{add50 if name != 'direct' else 0:8.2f} {add99 if name != 'direct' else 0:8.2f} {cpu} {r.errors:>6}"
            )
            table.append(
                {
                    "target": name,
                    "concurrency": c,
                    "rps": r.rps,
                    "p50_ms": r.pct(50) * ms,
                    "cpu_us_per_request": r.cpu_us_per_request if name != "direct" else None,
                    "p99_ms": r.pct(99) * ms,
                    "added_p50_ms": add50,
                    "added_p99_ms": add99,
                    "requests": len(r.latencies),
                    "errors": r.errors,
                    "mean_ms": statistics.fmean(r.latencies) * ms if r.latencies else None,
                }
            )
    print(f"\n{'target':<15} {'max req/s':>10}")
    maxes = {n: max(results[(n, c)].rps for c in concurrencies) for n in names}
    for n in names:
        print(f"{n:<15} {maxes[n]:10.1f}")
    verdict: dict[str, Any] = {}
    if "vllm-router" in names:
        worse = []
        for c in concurrencies:
            ours, peer, base = results[("pdbench", c)], results[("vllm-router", c)], results[("direct", c)]
            for q in (50, 99):
                if ours.pct(q) - base.pct(q) > peer.pct(q) - base.pct(q):
                    worse.append(f"p{q} overhead at c={c}")
        if maxes["pdbench"] < maxes["vllm-router"]:
            worse.append("max req/s")
        verdict = {
            "goal_met": not worse,
            "worse_than_vllm_router": worse,
            "throughput_ratio": maxes["pdbench"] / maxes["vllm-router"],
        }
        print(
            f"\npdbench vs vllm-router: max req/s ratio {verdict['throughput_ratio']:.2f}; goal "
            f"(overhead no higher, throughput no lower) {'MET' if not worse else 'NOT met: ' + ', '.join(worse)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"points": table, "max_rps": maxes, **verdict}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
