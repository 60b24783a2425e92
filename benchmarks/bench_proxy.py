"""PD proxy CPU per relayed token: pdbench's proxy against vllm-router and a do-nothing relay.

The headline is the streamed case, the way a real decode delivers tokens: `pdbench
mock-engine` as decode (its own process) writes every token as its own SSE event after an
inter-token latency (ITL 5 ms, OSL 256), so each token is one read and one write for a
proxy; a zero-delay mock prefill (its own process) answers the one-token prefill leg. For
every target and concurrency (64 and 256) one aiohttp client (this process) sends a fixed
number of streamed completions and checks each one (status 200, OSL token events, `[DONE]`).
CPU per relayed token = the target's process-tree CPU (user + system) over the run divided
by the tokens it relayed in that run (per-request work, the prefill leg included, is in it;
start-up is not). Targets take turns in every round, the order rotated by one each round;
medians over the rounds are compared and every round's value is printed, with the load.
Tokens per client read is printed too: tokens that reach a relay together cost it one read
and one write, so a point where they arrive batched (the machine not keeping up) gives lower
per-token figures, and the script says so.

Targets: pdbench (`pdbench proxy`), vllm-router (the peer), the relay floor
(benchmarks/relay_floor.py: the same event loop as pdbench's proxy, uvloop, relaying the
decode's bytes unchanged and doing nothing per token: what any proxy on this loop pays per
token, the kernel's read and write and the loop's callback) and, for reference, "direct"
(the client straight to decode: no proxy, no CPU to count).

Goal (exit 0 only when met): at every streamed concurrency, pdbench's CPU per relayed token
<= vllm-router's (medians), no failed request in any streamed run, and pdbench not served
more than 1.1x vllm-router's tokens per client read (else its figure would be flattered by
batching). pdbench's and vllm-router's cost above the floor is printed beside it.

The router's own overhead, by vllm-router's published method (its docs/benchmarks/
router_overhead.md: mock workers, the router's mean latency minus the direct mean, the router
process's CPU alone, at least three repeats): for pdbench and vllm-router at every streamed
concurrency, each round's mean latency (and mean TTFT, and mean time per streamed token after
the first) minus "direct"'s in the same round, and the router's own CPU per request and per
token; mean ± the 95% t-interval over the rounds (harness.interval, as the report's repeats).
Direct is one hop to decode: a PD request through a router also makes the (zero-delay) prefill
leg, so that hop is part of the router's figure, as it is of any PD router's. Not judged.

Then, labelled as such, the batched (ITL 0) table of the earlier version: the decode's 64
tokens come in one write, so it measures per-request work (CPU per request, req/s, latency)
and hides the per-token relay cost. Its references: "direct" (one hop) and "two-phase
direct" (the client itself makes both hops: the one-token prefill, then decode with the
prefill's kv_transfer_params). Two-phase direct is slower than the proxy on this client, so
it is a reference, not a bound; nothing in the batched table is judged.

    .venv/bin/python benchmarks/bench_proxy.py [--rounds 3] [--stream-concurrency 64,256] \\
        [--stream-requests 384,1536] [--no-batched] [--toy-proxy PATH] [--json out.json]

Peers:
- vllm-router: the `vllm-router` executable (PyPI `vllm-router`, Rust; the `bench` extra
  installs it, and the script fails without it), run with
  `--vllm-pd-disaggregation --prefill URL --decode URL --policy round_robin`.
- vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py), batched
  table only: give a copy with --toy-proxy (kept outside this repository). Without one, the
  script runs `toy_equivalent`, a re-implementation of the same flow on the same stack
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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.common import conditions_text, free_port, rotated, spread  # noqa: E402
from harness.interval import t_interval  # noqa: E402

PROMPT = " ".join(["benchmark"] * 128)
TWO_PHASE = "two-phase direct"
FLOOR = "relay floor"
DIRECT = ("direct", TWO_PHASE)  # the client's own hops: no proxy, no CPU of theirs to count
STREAM_ITL_MS = 5.0
STREAM_OSL = 256
BODY = {"model": "mock", "prompt": PROMPT, "max_tokens": 64, "stream": True, "ignore_eos": True}
STREAM_BODY = {**BODY, "max_tokens": STREAM_OSL}
HEADERS = {"Content-Type": "application/json"}
DONE = b"data: [DONE]\n\n"
BATCH_SLACK = 1.1  # tokens per client read above which a streamed point counts as batched


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
class Run:
    """One target at one concurrency in one round."""

    target: str
    concurrency: int
    round: int
    load1: float  # 1-minute load average when the run began (the machine is shared)
    cpu_s: float = 0.0  # the target's own CPU time over the run (warm-up included)
    sent: int = 0  # requests completed in that time, warm-up included
    tokens: int = 0  # token events relayed in that time (streamed runs)
    reads: int = 0  # pieces the client read (streamed runs)
    errors: int = 0
    client_cpu_s: float = 0.0  # this process's (the client's) CPU over the run
    seconds: float = 0.0  # measured seconds (batched) or the whole run's (streamed)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.sent * 1e6 if self.sent else float("nan")

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / self.tokens * 1e6 if self.tokens else float("nan")

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


PREFILL_BODY = {
    **BODY,
    "stream": False,
    "max_tokens": 1,
    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
}


async def run_streams(url: str, concurrency: int, requests: int, run: Run) -> None:
    """`requests` streamed completions of STREAM_OSL tokens, `concurrency` at a time; each is
    checked (status 200, STREAM_OSL token events, `[DONE]` last) and timed into `run`."""
    import aiohttp

    body = json.dumps(STREAM_BODY).encode()
    left = requests

    async def one(s: aiohttp.ClientSession) -> None:
        t0 = time.perf_counter()
        first = float("nan")
        parts: list[bytes] = []
        try:
            async with s.post(url, data=body, headers=HEADERS) as r:
                status = r.status
                async for piece in r.content.iter_any():
                    if not parts:
                        first = time.perf_counter() - t0
                    parts.append(piece)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            run.errors += 1
            return
        data = b"".join(parts)
        tokens = data.count(b"data: ") - 1  # every event but [DONE]
        if status != 200 or tokens != STREAM_OSL or not data.endswith(DONE):
            run.errors += 1
            return
        run.latencies.append(time.perf_counter() - t0)
        run.ttfts.append(first)
        run.sent += 1
        run.tokens += tokens
        run.reads += len(parts)

    async def slot(s: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one(s)

    conn = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        await asyncio.gather(*(slot(s) for _ in range(concurrency)))
    run.seconds = time.perf_counter() - t0


async def run_load(
    url: str, concurrency: int, seconds: float, warmup_s: float, prefill_url: str | None = None
) -> tuple[list[float], float, int, int]:
    """Batched (ITL 0): `concurrency` loops sending streamed completions for warm-up + `seconds`;
    latencies after warm-up.

    With `prefill_url` the client is its own proxy ("two-phase direct"): each request is a
    non-streamed one-token prefill there, then the streamed request with the prefill's
    kv_transfer_params to `url`, the two hops any PD proxy makes, with no proxy between."""
    import aiohttp

    body = json.dumps(BODY).encode()
    prefill_body = json.dumps(PREFILL_BODY).encode()

    async def two_phase(s: aiohttp.ClientSession, prefill_url: str) -> bytes:
        async with s.post(prefill_url, data=prefill_body, headers=HEADERS) as r:
            pre = await r.json(content_type=None)
            if r.status != 200:
                return b""
        data = dict(BODY, kv_transfer_params=pre.get("kv_transfer_params") or {})
        async with s.post(url, data=json.dumps(data).encode(), headers=HEADERS) as r:
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
                        ok = (await two_phase(s, prefill_url)).endswith(DONE)
                    else:
                        async with s.post(url, data=body, headers=HEADERS) as r:
                            data = await r.read()
                            ok = r.status == 200 and data.endswith(DONE)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                t1 = time.perf_counter()
                sent += ok
                errors += not ok  # warm-up's too: a failure anywhere is reported
                if ok and t0 >= t_measure and t1 <= t_end:
                    lat.append(t1 - t0)

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

        async def gen() -> AsyncIterator[bytes]:
            async with dec.stream("POST", api, json=data, headers=headers) as r:
                r.raise_for_status()
                async for chunk in r.aiter_bytes():
                    yield chunk

        return StreamingResponse(gen(), media_type="application/json")

    async def completions(request: Any) -> StreamingResponse:
        return await handle("/completions", request)

    # Set at run time: this module's string annotations cannot name a local import.
    completions.__annotations__ = {"request": Request}
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- orchestration -----------------------------------------------------------------------


def targets(args: argparse.Namespace, tmp: Path, p_url: str, d_url: str, batched: bool) -> dict[str, Proc | None]:
    """The targets of one phase, not started; the batched phase adds two-phase direct and the toy."""
    py = sys.executable
    # "direct": one hop to the decode engine; "two-phase direct": the client makes both hops.
    out: dict[str, Proc | None] = {"direct": None}
    if batched:
        out[TWO_PHASE] = None
    port = free_port()
    argv = [py, "-m", "harness", "proxy", "--host", "127.0.0.1", "--port", str(port), "--prefill", p_url]
    argv += ["--decode", d_url]
    if args.workers > 1:
        argv += ["--workers", str(args.workers)]
    out["pdbench"] = Proc("pdbench", argv, port, tmp / "pdbench.log")
    router = shutil.which("vllm-router") or str(Path(py).parent / "vllm-router")
    if not Path(router).exists():
        raise SystemExit(
            f"the peer is missing: {router} (install the bench extra: .venv/bin/pip install -e '.[bench]')"
        )
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
    port = free_port()
    out[FLOOR] = Proc(
        FLOOR,
        [
            py,
            str(REPO / "benchmarks" / "relay_floor.py"),
            "--port",
            str(port),
            "--prefill",
            p_url,
            "--decode",
            d_url,
            "--prefill-body",
            json.dumps(PREFILL_BODY),
        ],
        port,
        tmp / "floor.log",
    )
    if not batched:
        return out
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


def engines(tmp: Path, decode_itl_ms: float) -> list[Proc]:
    """Mock prefill (zero delay) and decode (`decode_itl_ms` between tokens), not started."""
    out = []
    for role in ("prefill", "decode"):
        port = free_port()
        argv = [sys.executable, "-m", "harness", "mock-engine", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--role", role, "--model", "mock"]
        if role == "decode":
            argv += ["--itl-ms", f"{decode_itl_ms:g}"]
        out.append(Proc(role, argv, port, tmp / f"{role}.log"))
    return out


def run_phase(args: argparse.Namespace, tmp: Path, batched: bool) -> list[Run]:
    """Start the engines and targets of one phase, run every round, stop them all."""
    tmp.mkdir()
    prefill, decode = engines(tmp, 0.0 if batched else STREAM_ITL_MS)
    p_url, d_url = (f"http://127.0.0.1:{e.port}" for e in (prefill, decode))
    procs = targets(args, tmp, p_url, d_url, batched)
    if batched:
        points = [(c, 0) for c in args.concurrency]
    else:
        points = list(zip(args.stream_concurrency, args.stream_requests, strict=True))
    runs: list[Run] = []
    started = [prefill, decode, *(p for p in procs.values() if p is not None)]
    try:
        for e in (prefill, decode):
            e.start()
        for e in (prefill, decode):
            wait_ready(f"http://127.0.0.1:{e.port}/v1/completions", 60, e)
        for target in started[2:]:
            target.start()
        for target in started[2:]:
            wait_ready(f"http://127.0.0.1:{target.port}/v1/completions", 60, target)
        names = list(procs)
        for rnd in range(args.rounds):
            for c, n in points:
                for name in rotated(names, rnd):
                    proc = procs[name]
                    url = f"http://127.0.0.1:{proc.port if proc is not None else decode.port}/v1/completions"
                    run = Run(name, c, rnd + 1, os.getloadavg()[0])
                    cpu0, client0 = cpu_seconds(proc), time.process_time()
                    if batched:
                        pre = f"{p_url}/v1/completions" if name == TWO_PHASE else None
                        lat, secs, errs, sent = asyncio.run(run_load(url, c, args.seconds, args.warmup, pre))
                        run.latencies, run.seconds, run.errors, run.sent = lat, secs, errs, sent
                    else:
                        asyncio.run(run_streams(url, c, n, run))
                    run.cpu_s, run.client_cpu_s = cpu_seconds(proc) - cpu0, time.process_time() - client0
                    runs.append(run)
                    per = (
                        f"{run.cpu_us_per_request:7.0f} us/req" if batched else f"{run.cpu_us_per_token:6.2f} us/token"
                    )
                    print(
                        f"{'batched' if batched else 'streamed'} round {rnd + 1} c={c:<3} {name:<15} "
                        f"{per if proc is not None else '-':>14} errors {run.errors} load {run.load1:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for target in reversed(started):
            target.stop()
    return runs


def pick(runs: list[Run], name: str, c: int) -> list[Run]:
    return [r for r in runs if r.target == name and r.concurrency == c]


def loads_text(runs: list[Run]) -> str:
    xs = [r.load1 for r in runs]
    return f"{min(xs):.2f}-{max(xs):.2f} (median {statistics.median(xs):.2f})"


def streamed_verdict(ours: float, peer: float, failures: int, ours_per_read: float, peer_per_read: float) -> bool:
    """The goal at one concurrency: pdbench's CPU per relayed token at most the peer's, with no
    failed request, and pdbench not served more tokens per read than the peer. Tokens that reach
    a relay together cost it one read and one write, so a target given more tokens per read
    would look cheaper per token for that alone."""
    return ours <= peer and failures == 0 and ours_per_read <= BATCH_SLACK * peer_per_read


def report_streamed(runs: list[Run], args: argparse.Namespace) -> tuple[list[tuple[str, str, bool]], list[dict]]:
    """Print the headline table; return the goals (text, goal, met) and the table's rows."""
    print(
        f"\nStreamed: CPU per relayed token. Conditions: mock decode ITL {STREAM_ITL_MS:g} ms, one token per SSE "
        f"event and per write, OSL {STREAM_OSL}, TTFT 0; zero-delay mock prefill (one-token answer); 128-word "
        f"prompt; each engine its own process; one aiohttp client process (this one); "
        + ", ".join(
            f"{n} requests at c={c}" for c, n in zip(args.stream_concurrency, args.stream_requests, strict=True)
        )
        + f" per target and round; {args.rounds} rounds, targets interleaved (the order rotated by one each round); "
        f"CPU = the target's process tree (user+system) over its run / tokens it relayed (per-request work "
        f"included, start-up not); median of the rounds; tok/read = tokens per read of the client "
        f"(1.00: every token arrived on its own); pdbench proxy --workers {args.workers}; {os.cpu_count()} CPUs, "
        f"shared; 1-min load average at the runs' starts {loads_text(runs)}"
    )
    print(
        f"{'conc':>4}  {'target':<12} {'CPU us/token':>12} {'above floor':>11} {'tok/read':>8} {'client CPU':>10} "
        f"{'p50 s':>6} {'p50 TTFT ms':>11} {'tok/s':>7} {'errors':>6}  CPU us/token per round"
    )
    names = ["pdbench", "vllm-router", FLOOR, "direct"]
    rows: list[dict[str, Any]] = []
    goals: list[tuple[str, str, bool]] = []
    warnings: list[str] = []
    for c in args.stream_concurrency:
        med = {name: statistics.median(r.cpu_us_per_token for r in pick(runs, name, c)) for name in names}
        per_read: dict[str, float] = {}
        for name in names:
            rs = pick(runs, name, c)
            per = [r.cpu_us_per_token for r in rs]
            tokens, reads = sum(r.tokens for r in rs), sum(r.reads for r in rs)
            per_read[name] = tokens / reads if reads else float("nan")
            lat = [x for r in rs for x in r.latencies]
            ttft = [x for r in rs for x in r.ttfts]
            seconds = sum(r.seconds for r in rs)
            tps = tokens / seconds
            client = sum(r.client_cpu_s for r in rs) / seconds
            errors = sum(r.errors for r in rs)
            proxied = name != "direct"
            above = med[name] - med[FLOOR] if proxied else float("nan")
            print(
                f"{c:>4}  {name:<12} {f'{med[name]:.2f}' if proxied else '-':>12} "
                f"{f'{above:+.2f}' if proxied else '-':>11} {per_read[name]:8.2f} {client:10.0%} "
                f"{pct(lat, 50):6.2f} {pct(ttft, 50) * 1e3:11.2f} {tps:7.0f} {errors:>6}  "
                f"{spread(per) if proxied else '-'}"
            )
            rows.append(
                {
                    "target": name,
                    "concurrency": c,
                    "cpu_us_per_token_rounds": per if proxied else None,
                    "cpu_us_per_token_median": med[name] if proxied else None,
                    "above_floor_us": above if proxied else None,
                    "tokens_per_client_read": per_read[name],
                    "client_cpu_share": client,
                    "p50_s": pct(lat, 50),
                    "p99_s": pct(lat, 99),
                    "p50_ttft_ms": pct(ttft, 50) * 1e3,
                    "tokens_per_s": tps,
                    "requests": sum(r.sent for r in rs),
                    "errors": errors,
                    "load1_rounds": [r.load1 for r in rs],
                }
            )
        ours, peer, floor = med["pdbench"], med["vllm-router"], med[FLOOR]
        errors = sum(r.errors for r in runs if r.concurrency == c)
        goals.append(
            (
                f"c={c}: CPU per relayed token pdbench {ours:.2f} us, vllm-router {peer:.2f} us "
                f"(vllm-router / pdbench {peer / ours:.2f}); above the floor's {floor:.2f} us: pdbench "
                f"{ours - floor:+.2f} us, vllm-router {peer - floor:+.2f} us; tokens per client read pdbench "
                f"{per_read['pdbench']:.2f}, vllm-router {per_read['vllm-router']:.2f}; failed requests {errors}",
                f"pdbench <= vllm-router, no failures, pdbench's tokens per read <= {BATCH_SLACK:g} x vllm-router's",
                streamed_verdict(ours, peer, errors, per_read["pdbench"], per_read["vllm-router"]),
            )
        )
        batched = [n for n in names if per_read[n] > BATCH_SLACK]
        if batched:
            warnings.append(
                f"c={c}: tokens arrived batched ({', '.join(f'{n} {per_read[n]:.2f}' for n in batched)} per client "
                f"read): the machine did not keep up with one token per read, so these per-token figures are "
                f"shared by several tokens per read and come out lower than at one token per read"
            )
    for w in warnings:
        print(f"warning: {w}")
    return goals, rows


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _per_token_s(run: Run) -> list[float]:
    """Each request's mean time per streamed token after the first."""
    return [(lat - ttft) / (STREAM_OSL - 1) for lat, ttft in zip(run.latencies, run.ttfts, strict=True)]


def overhead_rows(runs: list[Run], args: argparse.Namespace) -> list[dict]:
    """Each router's overhead over direct, by vllm-router's method (router_overhead.md): per round,
    its mean minus direct's mean in the same round; router-only CPU; the interval over the rounds."""
    rows: list[dict[str, Any]] = []
    for c in args.stream_concurrency:
        direct = {r.round: r for r in pick(runs, "direct", c)}
        for name in ("pdbench", "vllm-router"):
            rs = [r for r in pick(runs, name, c) if r.round in direct and r.latencies and direct[r.round].latencies]
            if len(rs) < 2:
                continue
            added = {
                "latency_ms": [(_mean(r.latencies) - _mean(direct[r.round].latencies)) * 1e3 for r in rs],
                "ttft_ms": [(_mean(r.ttfts) - _mean(direct[r.round].ttfts)) * 1e3 for r in rs],
                "per_token_us": [(_mean(_per_token_s(r)) - _mean(_per_token_s(direct[r.round]))) * 1e6 for r in rs],
            }
            cpu = {
                "cpu_us_per_request": [r.cpu_us_per_request for r in rs],
                "cpu_us_per_token": [r.cpu_us_per_token for r in rs],
            }
            rows.append(
                {"target": name, "concurrency": c, "rounds": len(rs)}
                | {f"added_{k}": t_interval(v).to_json() | {"rounds": v} for k, v in added.items()}
                | {k: t_interval(v).to_json() | {"rounds": v} for k, v in cpu.items()}
            )
    return rows


def report_overhead(rows: list[dict], runs: list[Run], args: argparse.Namespace) -> None:
    """Print the overhead table (not judged)."""
    print(
        f"\nRouter overhead by vllm-router's method (docs/benchmarks/router_overhead.md; not judged). Conditions: "
        f"the streamed runs above (mock workers: zero-delay prefill, decode ITL {STREAM_ITL_MS:g} ms, OSL "
        f"{STREAM_OSL}); per round, the router's mean minus direct's mean in the same round (direct: one hop to "
        f"decode, so the prefill leg is in the router's figure); router-only CPU = its process tree; mean ± 95% "
        f"t-interval over {args.rounds} rounds; {os.cpu_count()} CPUs, shared; 1-min load average at the runs' "
        f"starts {loads_text(runs)}"
    )
    print(
        f"{'conc':>4}  {'router':<12} {'+mean latency ms':>17} {'+mean TTFT ms':>15} {'+per token us':>15} "
        f"{'CPU us/req':>13} {'CPU us/token':>13}"
    )
    for row in rows:
        cell = lambda key, d=2, row=row: t_interval(row[key]["rounds"]).text(d)  # noqa: E731
        print(
            f"{row['concurrency']:>4}  {row['target']:<12} {cell('added_latency_ms'):>17} {cell('added_ttft_ms'):>15} "
            f"{cell('added_per_token_us', 1):>15} {cell('cpu_us_per_request', 0):>13} {cell('cpu_us_per_token'):>13}"
        )


def report_batched(runs: list[Run], args: argparse.Namespace) -> list[dict]:
    """Print the batched (ITL 0) table, judged by no goal; return its rows."""
    ms = 1000.0
    print(
        f"\nBatched (ITL 0; per-request work, hides the per-token relay cost; not judged). Conditions: "
        f"zero-delay mock prefill and decode engines (each its own process; the decode's {BODY['max_tokens']} "
        f"tokens come in one write), one aiohttp client process, concurrency "
        f"{','.join(map(str, args.concurrency))}, {args.rounds} rounds x {args.seconds:g} s (+{args.warmup:g} s "
        f"warm-up) per target and concurrency, interleaved; latency percentiles over all rounds' requests; CPU = "
        f"the target's process tree (user+system) over its run / requests completed; req/s and CPU: median of "
        f"the rounds; pdbench proxy --workers {args.workers}; {os.cpu_count()} CPUs, shared; 1-min load average "
        f"at the runs' starts {loads_text(runs)}. Two-phase direct (the client makes both hops itself) is a "
        f"reference, not a bound: this client is slower at it than the proxy."
    )
    print(
        f"{'conc':>4}  {'target':<17} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 1hop':>9} {'CPU us/req':>10} "
        f"{'errors':>6}  CPU us/req per round"
    )
    names = list(dict.fromkeys(r.target for r in runs))
    rows: list[dict[str, Any]] = []
    for c in args.concurrency:
        one = [x for r in pick(runs, "direct", c) for x in r.latencies]
        for name in names:
            rs = pick(runs, name, c)
            lat = [x for r in rs for x in r.latencies]
            cpu = [r.cpu_us_per_request for r in rs]
            add1 = (pct(lat, 50) - pct(one, 50)) * ms
            own = name not in DIRECT
            print(
                f"{c:>4}  {name:<17} {statistics.median(r.rps for r in rs):8.1f} {pct(lat, 50) * ms:8.2f} "
                f"{pct(lat, 99) * ms:8.2f} {add1:+9.2f} {f'{statistics.median(cpu):.0f}' if own else '-':>10} "
                f"{sum(r.errors for r in rs):>6}  {spread(cpu, '.0f') if own else '-'}"
            )
            rows.append(
                {
                    "target": name,
                    "concurrency": c,
                    "rps_rounds": [r.rps for r in rs],
                    "p50_ms": pct(lat, 50) * ms,
                    "p99_ms": pct(lat, 99) * ms,
                    "added_p50_ms_vs_one_hop": add1,
                    "cpu_us_per_request_rounds": cpu if name not in DIRECT else None,
                    "requests": len(lat),
                    "errors": sum(r.errors for r in rs),
                    "load1_rounds": [r.load1 for r in rs],
                }
            )
    c_hi = max(args.concurrency)
    ours = statistics.median(r.cpu_us_per_request for r in pick(runs, "pdbench", c_hi))
    peer = statistics.median(r.cpu_us_per_request for r in pick(runs, "vllm-router", c_hi))
    floor = statistics.median(r.cpu_us_per_request for r in pick(runs, FLOOR, c_hi))
    print(
        f"batched, c={c_hi}: CPU per request vllm-router {peer:.0f} us / pdbench {ours:.0f} us = {peer / ours:.2f}; "
        f"relay floor {floor:.0f} us (reference, not judged)"
    )
    return rows


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stream-concurrency", type=csv_ints, default=[64, 256])
    ap.add_argument(
        "--stream-requests", type=csv_ints, default=[384, 1536], help="requests per streamed run, one per concurrency"
    )
    ap.add_argument("--no-batched", action="store_true", help="skip the batched (ITL 0) table")
    ap.add_argument("--concurrency", type=csv_ints, default=[1, 16, 64], help="batched (ITL 0) concurrencies")
    ap.add_argument("--seconds", type=float, default=2.0, help="batched: measured seconds per run")
    ap.add_argument("--warmup", type=float, default=0.5, help="batched: warm-up seconds per run")
    ap.add_argument("--workers", type=int, default=1, help="pdbench proxy --workers")
    ap.add_argument("--toy-proxy", help="path to a copy of vLLM's toy_proxy_server.py (outside this repo)")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--serve-toy", nargs=3, metavar=("PORT", "PREFILL", "DECODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_toy:
        toy_equivalent(int(args.serve_toy[0]), args.serve_toy[1], args.serve_toy[2])
        return 0
    if len(args.stream_concurrency) != len(args.stream_requests):
        raise SystemExit("--stream-requests needs one count per --stream-concurrency value")
    if args.rounds < 3:
        raise SystemExit("--rounds must be >= 3: a median and a spread need three rounds")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    tmp = Path(tempfile.mkdtemp(prefix="pdbench-bench-proxy-"))
    when = {"streamed": conditions_text()}
    streamed = run_phase(args, tmp / "streamed", batched=False)
    when["batched"] = conditions_text()
    batched = [] if args.no_batched else run_phase(args, tmp / "batched", batched=True)
    when["end"] = conditions_text()
    goals, stream_rows = report_streamed(streamed, args)
    overhead = overhead_rows(streamed, args)
    report_overhead(overhead, streamed, args)
    batch_rows = report_batched(batched, args) if batched else []
    print(f"\nstarted {when['streamed']}; streamed part ended {when['batched']}; all ended {when['end']}")
    print()
    for text, goal, ok in goals:
        print(f"{text}; goal {goal}: {'PASS' if ok else 'FAIL'}")
    met = all(ok for _, _, ok in goals)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "conditions": when,
                    "streamed": stream_rows,
                    "overhead": overhead,
                    "batched": batch_rows,
                    "goals": [{"what": t, "goal": g, "met": ok} for t, g, ok in goals],
                },
                indent=2,
            )
        )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
