"""PD proxy overhead: pdbench's proxy against vllm-router and vLLM's NIXL toy proxy.

Zero-delay mock prefill and decode engines (`pdbench mock-engine`), one client process,
streamed completions of 64 tokens, concurrency 1, 16 and 64. For every target the
client measures end-to-end latency and requests per second. Two targets without a proxy
bound what a proxy can do: "direct" (one hop, straight to the decode engine) and
"two-phase direct" (the client itself sends the one-token prefill, then the decode
request with the prefill's kv_transfer_params: the two hops of any PD proxy, with no
proxy between). "Added" latency is a proxy's median minus two-phase direct's (and, for
reference, minus one hop's). All targets run in the same invocation, interleaved over
rounds so that machine drift hits them alike. Each proxy's own CPU time per request (its
process tree, from /proc) is printed too: unlike latency, it hardly moves with other load.

Goals (exit 0 only when all are met): CPU per request at the highest concurrency at most
a third of vllm-router's; added median latency at the lowest concurrency at most +1 ms
over two-phase direct; max req/s at least 0.8 of two-phase direct's.

    .venv/bin/python benchmarks/bench_proxy.py [--seconds 2] [--rounds 5] \\
        [--toy-proxy /tmp/peers/toy_proxy_server.py] [--json out.json]

Peers:
- vllm-router: the `vllm-router` executable (PyPI `vllm-router`, Rust; the `bench` extra
  installs it, and the script fails without it), run with
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
TWO_PHASE = "two-phase direct"
DIRECT = ("direct", TWO_PHASE)  # the client's own hops: no proxy, no CPU of theirs to count
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


PREFILL_BODY = {
    **BODY,
    "stream": False,
    "max_tokens": 1,
    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
}


async def run_load(
    url: str, concurrency: int, seconds: float, warmup_s: float, prefill_url: str | None = None
) -> tuple[list[float], float, int, int]:
    """One client: `concurrency` loops sending streamed completions; latencies after warm-up.

    With `prefill_url` the client is its own proxy ("two-phase direct"): each request is a
    non-streamed one-token prefill there, then the streamed request with the prefill's
    kv_transfer_params to `url`, the two hops any PD proxy makes, with no proxy between."""
    import aiohttp

    body = json.dumps(BODY).encode()
    prefill_body = json.dumps(PREFILL_BODY).encode()
    headers = {"Content-Type": "application/json"}

    async def two_phase(s: aiohttp.ClientSession) -> bytes:
        async with s.post(prefill_url, data=prefill_body, headers=headers) as r:
            pre = await r.json(content_type=None)
            if r.status != 200:
                return b""
        data = dict(BODY, kv_transfer_params=pre.get("kv_transfer_params") or {})
        async with s.post(url, data=json.dumps(data).encode(), headers=headers) as r:
            return await r.read() if r.status == 200 else b""

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
                    if prefill_url is not None:
                        ok = (await two_phase(s)).endswith(b"data: [DONE]\n\n")
                    else:
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
    # "direct": one hop to the decode engine; "two-phase direct": the client makes both hops.
    out: dict[str, Proc | None] = {"direct": None, TWO_PHASE: None}
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
                # Its metrics exporter binds 29000 by default: a free port, so that a router
                # left over elsewhere cannot make this one panic at start.
                "--prometheus-port",
                str(free_port()),
            ],
            port,
            tmp / "router.log",
        )
    else:
        raise SystemExit(
            f"the peer is missing: {router} (install the bench extra: .venv/bin/pip install -e '.[bench]')"
        )
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
                    pre = f"http://127.0.0.1:{engines[0].port}/v1/completions" if name == TWO_PHASE else None
                    cpu0 = cpu_seconds(proc)
                    lat, secs, errs, sent = asyncio.run(
                        run_load(f"http://127.0.0.1:{port}/v1/completions", c, args.seconds, args.warmup, pre)
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
    return 0 if report(results, concurrencies, list(procs), args) else 1


def report(
    results: dict[tuple[str, int], Result], concurrencies: list[int], names: list[str], args: argparse.Namespace
) -> bool:
    """Print the table and the goals; True when every goal is met."""
    ms = 1000.0
    print(
        f"\nPD proxy overhead. Conditions: zero-delay mock prefill and decode engines (each its own process; "
        f"the decode's {BODY['max_tokens']} tokens come in one write, ITL 0), one aiohttp client process, "
        f"concurrency {','.join(map(str, concurrencies))}, {args.rounds} rounds x {args.seconds:g} s per target "
        f"and concurrency, interleaved; latency percentiles over all rounds' requests; CPU = the target's "
        f"process tree (user+system) over its rounds; pdbench proxy --workers {args.workers}; {os.cpu_count()} CPUs"
    )
    print(
        f"{'conc':>4}  {'target':<17} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 2ph':>8} {'+p50 1hop':>9} "
        f"{'cpu us/req':>10} {'errors':>6}"
    )
    table: list[dict[str, Any]] = []
    for c in concurrencies:
        one, two = results[("direct", c)], results[(TWO_PHASE, c)]
        for name in names:
            r = results[(name, c)]
            add2 = (r.pct(50) - two.pct(50)) * ms
            add1 = (r.pct(50) - one.pct(50)) * ms
            cpu = f"{r.cpu_us_per_request:10.0f}" if name not in DIRECT else f"{'-':>10}"
            print(
                f"{c:>4}  {name:<17} {r.rps:8.1f} {r.pct(50) * ms:8.2f} {r.pct(99) * ms:8.2f} "
                f"{add2:8.2f} {add1:9.2f} {cpu} {r.errors:>6}"
            )
            table.append(
                {
                    "target": name,
                    "concurrency": c,
                    "rps": r.rps,
                    "p50_ms": r.pct(50) * ms,
                    "p99_ms": r.pct(99) * ms,
                    "added_p50_ms_vs_two_phase_direct": add2,
                    "added_p50_ms_vs_one_hop": add1,
                    "added_p99_ms_vs_two_phase_direct": (r.pct(99) - two.pct(99)) * ms,
                    "cpu_us_per_request": r.cpu_us_per_request if name not in DIRECT else None,
                    "requests": len(r.latencies),
                    "errors": r.errors,
                    "mean_ms": statistics.fmean(r.latencies) * ms if r.latencies else None,
                }
            )
    maxes = {n: max(results[(n, c)].rps for c in concurrencies) for n in names}
    print(f"\n{'target':<17} {'max req/s':>10}")
    for n in names:
        print(f"{n:<17} {maxes[n]:10.1f}")
    c_hi, c_lo = max(concurrencies), min(concurrencies)
    ours, peer = results[("pdbench", c_hi)], results[("vllm-router", c_hi)]
    cpu_ratio = peer.cpu_us_per_request / ours.cpu_us_per_request
    added = (results[("pdbench", c_lo)].pct(50) - results[(TWO_PHASE, c_lo)].pct(50)) * ms
    ceiling = maxes["pdbench"] / maxes[TWO_PHASE]
    goals = [
        (
            f"CPU per request at c={c_hi}: vllm-router {peer.cpu_us_per_request:.0f} us / pdbench "
            f"{ours.cpu_us_per_request:.0f} us = {cpu_ratio:.2f}",
            ">= 3",
            cpu_ratio >= 3,
        ),
        (f"added median latency at c={c_lo} over two-phase direct: {added:+.2f} ms", "<= +1 ms", added <= 1.0),
        (
            f"max req/s pdbench {maxes['pdbench']:.0f} / two-phase direct {maxes[TWO_PHASE]:.0f} = {ceiling:.2f}",
            ">= 0.8",
            ceiling >= 0.8,
        ),
    ]
    print()
    for text, goal, ok in goals:
        print(f"{text}; goal {goal}: {'PASS' if ok else 'FAIL'}")
    met = all(ok for _, _, ok in goals)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"points": table, "max_rps": maxes, "goals": [{"what": t, "goal": g, "met": ok} for t, g, ok in goals]},
                indent=2,
            )
        )
    return met


if __name__ == "__main__":
    sys.exit(main())
