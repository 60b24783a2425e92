#!/usr/bin/env python3
"""The floor of a Python streaming client: uvloop, one connection per in-flight request,
a protocol whose data_received only looks for the end of the response. No parsing, no
timing, no results. bench_client_cpu.py measures it beside the real clients, so the CPU per
token that any uvloop client pays (the kernel's read per token and the loop's callback) is
known in the same run, and what a client adds on top of it shows.

    python benchmarks/stream_floor.py --base-url URL --model M --num-prompts N --concurrency C --osl O
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.bench.client import Target, build_payload

_END = b"0\r\n\r\n"  # the last chunk of a chunked response


class _Reader(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request, self.done = request, done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if data.endswith(_END):
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed before the end of the response"))


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    target = Target.from_url(args.base_url.rstrip("/") + "/v1/completions")
    request = target.request_bytes(build_payload("completions", args.model, "hello " * args.isl, args.osl, True))
    left = args.num_prompts

    async def slot() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            done: asyncio.Future[None] = loop.create_future()
            connect = loop.create_connection(lambda done=done: _Reader(request, done), target.host, target.port)
            await asyncio.wait_for(connect, 60)
            await asyncio.wait_for(done, 600)

    await asyncio.gather(*(slot() for _ in range(args.concurrency)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, required=True)
    import uvloop

    uvloop.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
