"""The MoRI-IO, Mooncake and pdbench flows and the routing policies, against recording
fakes; MoRI-IO instances register over real ZMQ DEALER sockets, as vLLM's connector does.
The fakes steer failures and timing; what vLLM itself sends and reads is checked against
the installed vLLM's code in tests/proxy/test_moriio_vllm.py and tests/proxy/test_mooncake_vllm.py."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from helpers.proxy_fakes import (
    CHUNKS,
    COMPLETION,
    DONE,
    KV,
    NIXL_PREFILL_KV,
    Fake,
    counts,
    metrics_text,
    moriio_stack,
    proxy_client,
    read_all,
    run,
    stack,
    wait_health,
)

from benchmarks.common import free_port
from harness.proxy import ProxyConfig
from harness.proxy.backends import Pool
from harness.proxy.flows import affinity_key, parse_request
from harness.proxy.registry import RegistrationError, Registry, parse_registration
from harness.rundir.proxy_timings import HEADER as TIMING_HEADER

READ_KV = {
    "remote_engine_id": "eng-P",
    "remote_block_ids": [7, 8],
    "transfer_id": "tx-from-prefill",
    "do_remote_decode": False,
    "do_remote_prefill": True,
}


# -- MoRI-IO ------------------------------------------------------------------------


def gen1(fake: Fake, role: str, index: int = 0, mode: str = "READ", dp: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "type": "register",
        "role": role,
        "index": str(index),
        "request_address": f"{fake.url}/v1/completions",
        "handshake_port": 6301,
        "notify_port": 61005,
        "dp_size": dp,
        "tp_size": 1,
        "transfer_mode": mode,
        **extra,
    }


def gen2(fake: Fake, role: str, mode: str = "READ", dp: int = 1, notify: int = 61005) -> dict[str, Any]:
    return {
        "type": role,
        "http_address": fake.url.removeprefix("http://"),
        "zmq_address": f"host:127.0.0.1,handshake:6301,notify:{notify}",
        "dp_size": dp,
        "tp_size": 2,
        "transfer_mode": mode,
    }


class Dealer:
    """One instance's registration socket (a ZMQ DEALER, like vLLM's heartbeat process)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    async def send(self, payload: Any) -> None:
        await self.sock.send(msgpack.packb(payload))

    async def send_raw(self, raw: bytes) -> None:
        await self.sock.send(raw)


def test_moriio_gen1_registration_dedup_and_read_flow() -> None:
    async def body() -> None:
        p = Fake("prefill", kv=dict(READ_KV))
        d = Fake("decode")
        async with moriio_stack([p, d]) as (client, ctx, endpoint):
            state = await (await client.get("/health")).json()
            assert counts(state) == {
                "status": "not_ready",
                "prefill_instances": 0,
                "decode_instances": 0,
                "expected_prefill": 1,
                "expected_decode": 1,
            }
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 503
            dealer = Dealer(ctx, endpoint)
            await dealer.send({"type": "HELLO"})
            for index in (0, 0, 1):  # duplicates, and a second rank of the same instance
                await dealer.send(gen1(p, "P", index))
            await dealer.send(gen1(d, "D"))
            await dealer.send(gen1(d, "D"))
            state = await wait_health(client, 200)
            assert state["transfer_mode"] == "read"
            assert [(b["role"], b["url"], b["source"]) for b in state["backends"]] == [
                ("prefill", p.url, "gen1"),
                ("decode", d.url, "gen1"),
            ]

            req = {**COMPLETION, "max_tokens": 10, "max_completion_tokens": 10}
            resp = await client.post("/v1/completions", json=req)
            assert resp.status == 200
            assert await read_all(resp) == b"".join(CHUNKS) + DONE

        ((ph, pb),) = p.received
        ((dh, db),) = d.received
        assert pb["max_tokens"] == 1 and pb["max_completion_tokens"] == 1 and pb["stream"] is False
        assert "stream_options" not in pb and pb["min_tokens"] == 1  # EOS masked for the one token
        tid = pb["kv_transfer_params"]["transfer_id"]
        assert tid.startswith("tx-")
        assert pb["kv_transfer_params"] == {
            "remote_dp_size": 1,
            "remote_tp_size": 1,
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "transfer_id": tid,
            "remote_handshake_port": 6301,
            "remote_notify_port": 61005,
            "remote_host": "127.0.0.1",
            "remote_port": int(d.url.rsplit(":", 1)[1]),
        }
        assert db["max_tokens"] == 9 and db["max_completion_tokens"] == 9  # prefill made the first token
        assert db["min_tokens"] == 3 and db["stream"] is True
        assert db["kv_transfer_params"] == {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            # READ: decode pulls, so it gets where the KV sits (copied from prefill's answer).
            "remote_engine_id": "eng-P",
            "remote_block_ids": [7, 8],
            "transfer_id": "tx-from-prefill",
            "remote_dp_size": 1,
            "remote_tp_size": 1,
            "remote_handshake_port": 6301,
            "remote_notify_port": 61005,
            "remote_host": "127.0.0.1",
            "remote_port": int(p.url.rsplit(":", 1)[1]),
        }
        assert ph["X-Request-Id"] == dh["X-Request-Id"]
        assert ph["X-Request-Id"].startswith("___prefill_addr_host:127.0.0.1,handshake:6301,notify:61005")
        assert "X-data-parallel-rank" not in ph

    run(body)


def test_moriio_gen2_heartbeats_upsert_dp_ranks_and_write_flow() -> None:
    async def body() -> None:
        # WRITE: legs run at once. Prefill answers only after decode got its request,
        # so a proxy that ran them one after the other would fail this test.
        d = Fake("decode")
        p = Fake("prefill", kv=None, wait_for=d)
        async with moriio_stack([p, d], moriio_mode="write") as (client, ctx, endpoint):
            dp, dd = Dealer(ctx, endpoint), Dealer(ctx, endpoint)
            for _ in range(3):  # heartbeats
                await dp.send(gen2(p, "P", mode="WRITE", dp=2))
                await dd.send(gen2(d, "D", mode="WRITE"))
            await dp.send(gen2(p, "P", mode="WRITE", dp=2, notify=61007))  # upsert by http_address
            state = await wait_health(client, 200)
            assert len(state["backends"]) == 2
            assert all(b["source"] == "gen2" and "heartbeat_age_s" in b for b in state["backends"])
            text = await metrics_text(client)
            assert 'pdbench_proxy_registrations_total{result="new"} 2.0' in text
            assert 'pdbench_proxy_registrations_total{result="updated"} 1.0' in text
            assert 'pdbench_proxy_registrations_total{result="heartbeat"} 4.0' in text

            for _ in range(2):
                p.started.clear(), d.started.clear()
                resp = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "tiny",
                        "messages": [{"role": "user", "content": "hi"}],
                        "stream": True,
                        "max_completion_tokens": 5,
                    },
                )
                assert resp.status == 200
                assert await read_all(resp) == b"".join(CHUNKS) + DONE

        ranks = []
        for (ph, pb), (dh, db) in zip(p.received, d.received, strict=False):
            ranks.append(ph["X-data-parallel-rank"])
            assert ph["X-Request-Id"] == dh["X-Request-Id"]
            rid = ph["X-Request-Id"]
            assert rid.startswith(
                "___prefill_addr_host:127.0.0.1,handshake:6301,notify:61007___decode_addr_"
                "host:127.0.0.1,handshake:6301,notify:61005_"
            )
            assert len(rid.rsplit("_", 1)[1]) == 32
            tid = pb["kv_transfer_params"]["transfer_id"]
            assert pb["kv_transfer_params"] == {
                "remote_dp_size": 1,
                "remote_tp_size": 2,
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "transfer_id": tid,
            }
            assert pb["max_tokens"] == 1 and pb["max_completion_tokens"] == 1
            assert db["max_completion_tokens"] == 4 and "max_tokens" not in db
            assert db["kv_transfer_params"] == {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "transfer_id": tid,
                "remote_dp_size": 2,
                "remote_tp_size": 2,
                "remote_dp_rank": int(ph["X-data-parallel-rank"]),
            }
        assert ranks == ["0", "1"]

    run(body)


def test_moriio_health_with_missing_workers_heartbeat_expiry_and_mode_mismatch() -> None:
    async def body() -> None:
        p1, p2, d = Fake("prefill"), Fake("prefill"), Fake("decode")
        async with moriio_stack([p1, p2, d], expected_prefill=2, registration_ttl_s=0.3) as (client, ctx, ep):
            dealer = Dealer(ctx, ep)
            await dealer.send(gen2(p1, "P"))
            await dealer.send(gen2(d, "D"))
            state = await wait_health(client, 503, lambda b: b["prefill_instances"] == 1 and b["decode_instances"] == 1)
            assert counts(state) == {
                "status": "not_ready",
                "prefill_instances": 1,
                "decode_instances": 1,
                "expected_prefill": 2,
                "expected_decode": 1,
            }
            await dealer.send(gen2(p2, "P", mode="WRITE"))  # disagrees with READ: rejected
            await dealer.send(b"not msgpack at all")  # type: ignore[arg-type]
            await dealer.send_raw(b"\xc1")
            await dealer.send({"type": "D", "http_address": "nohost"})
            await dealer.send({"type": "register", "role": "X"})
            await dealer.send([1, 2, 3])
            await dealer.send(gen2(p1, "P"))  # heartbeats keep p1 and d fresh (TTL 0.3 s)
            await dealer.send(gen2(d, "D"))
            await asyncio.sleep(0.1)
            state = await (await client.get("/health")).json()
            assert state["prefill_instances"] == 1 and len(state["backends"]) == 2  # p2 was rejected
            # Keep heartbeating all three: ready. Then p1 goes silent: its entry expires.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for f, role in ((p1, "P"), (p2, "P"), (d, "D")):
                    await dealer.send(gen2(f, role))
                if (await client.get("/health")).status == 200:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("never ready")
            for _ in range(20):
                await dealer.send(gen2(p2, "P"))
                await dealer.send(gen2(d, "D"))
                state = await (await client.get("/health")).json()
                if state["prefill_instances"] == 1:
                    break
                await asyncio.sleep(0.05)
            assert counts(state)["status"] == "not_ready"
            assert [b["ready"] for b in state["backends"] if b["url"] == p1.url] == [False]
            text = await metrics_text(client)
            assert 'pdbench_proxy_registrations_total{result="rejected"}' in text
            assert 'pdbench_proxy_registrations_total{result="invalid"}' in text

    run(body)


def test_moriio_write_prefill_failure_ends_decode_stream() -> None:
    async def body() -> None:
        d = Fake("decode", stall_after_first=True)  # waits for KV that never comes
        p = Fake("prefill", status=500, wait_for=d)
        async with moriio_stack([p, d], moriio_mode="write", stream_idle_timeout_s=30) as (client, ctx, ep):
            dealer = Dealer(ctx, ep)
            await dealer.send(gen2(p, "P", mode="WRITE"))
            await dealer.send(gen2(d, "D", mode="WRITE"))
            await wait_health(client, 200)
            start = time.monotonic()
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 200
            got = b""
            try:
                async for chunk in resp.content.iter_any():
                    got += chunk
            except Exception:
                pass
            assert time.monotonic() - start < 5  # not the 30 s idle timeout
            assert p.url.encode() in got and b"prefill_upstream_5xx" in got and DONE not in got
            await asyncio.wait_for(d.cancelled.wait(), 5)

    run(body)


def test_moriio_write_prefill_failure_before_decode_answers() -> None:
    async def body() -> None:
        d = Fake("decode", stall_before_headers=True)
        p = Fake("prefill", status=500, wait_for=d)
        async with moriio_stack([p, d], moriio_mode="write") as (client, ctx, ep):
            dealer = Dealer(ctx, ep)
            await dealer.send(gen1(p, "P", mode="WRITE"))
            await dealer.send(gen1(d, "D", mode="WRITE"))
            await wait_health(client, 200)
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 502
            err = (await resp.json())["error"]
            assert err["backend"] == p.url and "prefill returned HTTP 500" in err["message"]
            await asyncio.wait_for(d.cancelled.wait(), 5)

    run(body)


def test_registration_socket_binds_only_the_address_it_was_given() -> None:
    async def body() -> None:
        port = free_port()
        reg = Registry(Pool(ProxyConfig(connector="moriio", moriio_port=port)), None, lambda m: None)
        bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(reg.serve("127.0.0.2", port, bound))
        try:
            assert await asyncio.wait_for(bound, 5) == f"tcp://127.0.0.2:{port}"
            loop = asyncio.get_running_loop()
            for host, ok in (("127.0.0.2", True), ("127.0.0.1", False)):
                s = socket.socket()
                s.setblocking(False)
                try:
                    await asyncio.wait_for(loop.sock_connect(s, (host, port)), 2)
                    assert ok, f"registration socket reachable on {host}"
                except ConnectionRefusedError:
                    assert not ok, f"registration socket not reachable on {host}"
                finally:
                    s.close()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run(body)


def test_registration_parsing() -> None:
    f = Fake("prefill", url="http://10.1.2.3:2584")
    reg = parse_registration(gen1(f, "P", handshake_port="6301", notify_port="61005"))
    assert reg is not None
    assert (reg["gen"], reg["role"], reg["url"], reg["handshake_port"], reg["mode"]) == (
        "gen1",
        "prefill",
        "http://10.1.2.3:2584",
        6301,
        "read",
    )
    assert reg["zmq_address"] == "host:10.1.2.3,handshake:6301,notify:61005"
    reg = parse_registration(gen2(f, "D", mode="WRITE"))
    assert reg is not None and (reg["gen"], reg["role"], reg["url"], reg["mode"]) == (
        "gen2",
        "decode",
        "http://10.1.2.3:2584",
        "write",
    )
    assert parse_registration({"type": "HELLO"}) is None
    for bad in (
        {"type": "P", "http_address": "10.0.0.1:1", "zmq_address": "host:x"},
        {**gen1(f, "P"), "handshake_port": "abc"},
        {**gen1(f, "P"), "dp_size": True},
        {**gen2(f, "P"), "transfer_mode": "PUSH"},
        {"type": "?"},
        "str",
    ):
        with pytest.raises(RegistrationError):
            parse_registration(bad)


# -- Mooncake --------------------------------------------------------------------------


def engines_of(*ids: str) -> dict[str, Any]:
    """A bootstrap /query answer in vLLM 0.32's shape (tests/proxy/test_mooncake_vllm.py runs vLLM's
    own server): per DP rank, its engine id and its workers' {tp_rank: {pp_rank: address}}."""
    return {
        str(r): {"engine_id": e, "worker_addr": {"0": {"0": f"tcp://127.0.0.1:{17000 + r}"}}} for r, e in enumerate(ids)
    }


@asynccontextmanager
async def bootstrap_server(engines: dict[str, Any]) -> AsyncIterator[int]:
    async def query(request: web.Request) -> web.Response:
        return web.json_response(engines)

    app = web.Application()
    app.router.add_get("/query", query)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server.port  # type: ignore[misc]
    finally:
        await server.close()


def test_mooncake_concurrent_legs_transfer_id_bootstrap_and_dp_ranks() -> None:
    async def body() -> None:
        engines = engines_of("eng-0", "eng-1")
        async with bootstrap_server(engines) as bport:
            d = Fake("decode")
            p = Fake("prefill", kv=None, wait_for=d)  # answers only once decode has its request
            async with stack([p], [d], connector="mooncake", bootstrap_ports=[bport]) as client:
                state = await (await client.get("/health")).json()
                assert state["backends"][0]["engine_ids"] == {"0": "eng-0", "1": "eng-1"}
                for _ in range(2):
                    d.started.clear()
                    resp = await client.post("/v1/completions", json=COMPLETION)
                    assert resp.status == 200
                    assert await read_all(resp) == b"".join(CHUNKS) + DONE
                    await asyncio.sleep(0.05)  # let the prefill leg finish in the background
        for i, ((ph, pb), (dh, db)) in enumerate(zip(p.received, d.received, strict=False)):
            rid = ph["X-Request-Id"]
            assert dh["X-Request-Id"] == rid
            assert ph["X-data-parallel-rank"] == str(i)
            assert pb["kv_transfer_params"] == {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "transfer_id": f"xfer-{rid}",
            }
            assert pb["max_tokens"] == 1 and pb["stream"] is False
            assert db["max_tokens"] == COMPLETION["max_tokens"]
            assert db["kv_transfer_params"] == {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "remote_bootstrap_addr": f"http://127.0.0.1:{bport}",
                "remote_engine_id": f"eng-{i}",
                "transfer_id": f"xfer-{rid}",
            }

    run(body)


def test_mooncake_prefill_not_ready_without_bootstrap() -> None:
    async def body() -> None:
        async with stack(
            [Fake("prefill")], [Fake("decode")], connector="mooncake", bootstrap_ports=[free_port()], wait_ready=False
        ) as client:
            state = await wait_health(client, 503, lambda b: b["decode_instances"] == 1)
            assert state["prefill_instances"] == 0  # healthy, but its engines are unknown

    run(body)


# -- the bundled pdbench connector ----------------------------------------------------


def test_pdbench_connector_uses_two_phase_flow() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        async with stack([p], [d], connector="pdbench") as client:
            for _ in range(2):  # without overlap, every request is two-phase
                resp = await client.post("/v1/completions", json=COMPLETION)
                assert resp.status == 200
                await read_all(resp)
        for (ph, pb), (_, db) in zip(p.received, d.received, strict=True):
            # Prefill holds the blocks under the proxy's key; its answer names it (here: KV).
            assert pb["kv_transfer_params"] == {**NIXL_PREFILL_KV, "pull_key": f"pd-{ph['X-Request-Id']}"}
            assert db == {**COMPLETION, "kv_transfer_params": KV}

    run(body)


def test_pdbench_overlap_sends_decode_with_prefill_once_the_endpoint_is_known() -> None:
    async def body() -> None:
        d = Fake("decode")
        # Answers only once decode has its request: the legs must be in flight together.
        p = Fake("prefill", kv={**KV, "tp_size": 2})
        async with stack([p], [d], connector="pdbench", overlap=True) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)  # learns the endpoint
            assert resp.status == 200 and await read_all(resp) == b"".join(CHUNKS) + DONE
            p.wait_for = d
            for _ in range(2):
                d.started.clear()
                resp = await client.post("/v1/completions", json=COMPLETION)
                assert resp.status == 200 and await read_all(resp) == b"".join(CHUNKS) + DONE
                await asyncio.sleep(0.05)  # the prefill leg ends in the background
        assert d.received[0][1] == {**COMPLETION, "kv_transfer_params": {**KV, "tp_size": 2}}
        for (ph, pb), (dh, db) in zip(p.received[1:], d.received[1:], strict=True):
            key = f"pd-{ph['X-Request-Id']}"
            assert dh["X-Request-Id"] == ph["X-Request-Id"]
            assert pb["kv_transfer_params"]["pull_key"] == key and pb["max_tokens"] == 1
            assert db == {
                **COMPLETION,
                "kv_transfer_params": {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_engine_id": KV["remote_engine_id"],
                    "remote_host": KV["remote_host"],
                    "remote_port": KV["remote_port"],
                    "tp_size": 2,
                    "remote_request_id": key,
                    "pull_key": key,
                },
            }

    run(body)


@pytest.mark.parametrize("overlap", [False, True])
def test_pdbench_passes_the_clients_timing_id_to_decode_only(overlap: bool, tmp_path: Path) -> None:
    async def body() -> None:
        p, d = Fake("prefill", kv={**KV, "tp_size": 1}), Fake("decode")
        async with stack([p], [d], connector="pdbench", overlap=overlap, timings_dir=str(tmp_path)) as client:
            # The first request teaches the overlapped flow prefill's endpoint; the second is timed.
            for tag in (None, "bench-7", None):
                headers = {TIMING_HEADER: tag} if tag else {}
                resp = await client.post("/v1/completions", json=COMPLETION, headers=headers)
                assert resp.status == 200 and await read_all(resp) == b"".join(CHUNKS) + DONE
            deadline = time.monotonic() + 5.0
            while len(p.received) < 3 and time.monotonic() < deadline:  # overlap: prefill ends in the background
                await asyncio.sleep(0.01)
        assert len(p.received) == 3 and len(d.received) == 3
        if overlap:  # precondition: the timed request's legs went out together
            assert d.received[1][1]["kv_transfer_params"]["pull_key"] == f"pd-{p.received[1][0]['X-Request-Id']}"
        assert [db["kv_transfer_params"].get("pdbench_id") for _, db in d.received] == [None, "bench-7", None]
        assert all("pdbench_id" not in pb["kv_transfer_params"] for _, pb in p.received)  # decode's connector only

    run(body)


def test_pdbench_overlap_prefill_failure_fails_the_request() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        async with stack([p], [d], connector="pdbench", overlap=True) as client:
            assert (await client.post("/v1/completions", json=COMPLETION)).status == 200
            p.status, d.stall_before_headers = 500, True  # decode waits for KV that never comes
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status >= 500
            assert "prefill" in (await resp.text())

    run(body)


def test_overlap_is_only_for_the_pdbench_connector() -> None:
    with pytest.raises(ValueError, match="overlap only applies to connector pdbench"):
        ProxyConfig(connector="nixl", prefill=["http://a:1"], decode=["http://b:1"], overlap=True)


# -- routing policies ---------------------------------------------------------------------


def test_least_outstanding_avoids_the_busy_decode() -> None:
    async def body() -> None:
        busy, idle = Fake("decode", stall_after_first=True), Fake("decode")
        async with stack([Fake("prefill")], [busy, idle], policy="least_outstanding") as client:
            held = await client.post("/v1/completions", json=COMPLETION)
            assert await held.content.readany() == CHUNKS[0]
            first = busy if busy.received else idle
            other = idle if first is busy else busy
            for _ in range(4):
                resp = await client.post("/v1/completions", json={**COMPLETION, "stream": False})
                assert resp.status == 200
                await resp.read()
            held.close()
        assert len(first.received) == 1 and len(other.received) == 4

    run(body)


def test_prefix_hash_keeps_a_prefix_on_one_instance() -> None:
    async def body() -> None:
        prefills = [Fake("prefill") for _ in range(3)]
        decodes = [Fake("decode") for _ in range(3)]
        async with stack(prefills, decodes, policy="prefix_hash", prefix_chars=64) as client:
            shared = "You are a helpful assistant. " * 4
            for i in range(4):  # same first 64 characters, different tails
                resp = await client.post(
                    "/v1/completions", json={**COMPLETION, "stream": False, "prompt": shared + str(i)}
                )
                await resp.read()
            assert sorted(len(f.received) for f in prefills) == [0, 0, 4]
            assert sorted(len(f.received) for f in decodes) == [0, 0, 4]
            for i in range(30):
                resp = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]},
                )
                await resp.read()
        assert sum(1 for f in prefills if f.received) == 3  # distinct prefixes spread out

    run(body)


def test_affinity_key_and_parse_request() -> None:
    a = affinity_key({"prompt": "x" * 100 + "a"}, 100)
    assert a == affinity_key({"prompt": "x" * 100 + "b"}, 100)
    assert a != affinity_key({"prompt": "y" * 101}, 100)
    assert affinity_key({"prompt": [1, 2, 3]}, 64) == affinity_key({"prompt": [[1, 2, 3]]}, 64)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert affinity_key({"messages": msgs}, 64) == affinity_key({"messages": [{"role": "user", "content": "hi"}]}, 64)
    body = parse_request(b'{"prompt": [1, 2], "max_tokens": null, "kv_transfer_params": {}}', chat=False)
    assert body == {"prompt": [1, 2], "max_tokens": None}


def test_static_dp_ranks_round_robin_over_flat_slots() -> None:
    async def body() -> None:
        engines = engines_of("a0", "a1")
        async with bootstrap_server(engines) as bport:
            p1, p2, d = Fake("prefill", kv=None), Fake("prefill", kv=None), Fake("decode")
            async with stack([p1, p2], [d], connector="mooncake", bootstrap_ports=[bport]) as client:
                for _ in range(4):
                    resp = await client.post("/v1/completions", json={**COMPLETION, "stream": False})
                    await resp.read()
                await asyncio.sleep(0.05)
        assert [h["X-data-parallel-rank"] for h, _ in p1.received] == ["0", "1"]
        assert [h["X-data-parallel-rank"] for h, _ in p2.received] == ["0", "1"]

    run(body)


# -- against pdbench's own mock engines -------------------------------------------------


def test_nixl_flow_against_mock_engines() -> None:
    import harness.mock_engine as mock

    async def body() -> None:
        servers = []
        urls = []
        for role in ("prefill", "decode"):
            server = TestServer(mock.build_app(mock.MockEngineConfig(role=role, model="m")), host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            urls.append(str(server.make_url("")).rstrip("/"))
        try:
            config = ProxyConfig(prefill=[urls[0]], decode=[urls[1]], health_interval_s=0.05)
            async with proxy_client(config) as client:
                await wait_health(client, 200)
                req = {
                    "model": "m",
                    "prompt": "one two three four",
                    "max_tokens": 8,
                    "stream": True,
                    "ignore_eos": True,
                    "stream_options": {"include_usage": True},
                }
                resp = await client.post("/v1/completions", json=req)
                assert resp.status == 200
                data = await read_all(resp)
                assert data.endswith(DONE) and data.count(b'"text"') == 8
                chat = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": "hi there"}],
                        "max_completion_tokens": 3,
                    },
                )
                assert chat.status == 200
                assert (await chat.json())["usage"]["completion_tokens"] == 3
            async with TestClient(servers[1]) as dc:  # type: ignore[arg-type]
                text = await (await dc.get("/metrics")).text()
        finally:
            for s in servers:
                await s.close()
        # Decode took the prompt's KV from prefill instead of recomputing it.
        hits = [line for line in text.splitlines() if line.startswith("vllm:external_prefix_cache_hits_total")]
        assert hits and float(hits[0].rsplit(" ", 1)[1]) > 0

    run(body)


def test_moriio_read_without_prefill_kv_lets_decode_recompute() -> None:
    async def body() -> None:
        p, d = Fake("prefill", kv=None), Fake("decode")
        async with moriio_stack([p, d], moriio_mode="read") as (client, ctx, endpoint):
            dealer = Dealer(ctx, endpoint)
            await dealer.send(gen2(p, "P"))
            await dealer.send(gen2(d, "D"))
            await wait_health(client, 200)
            resp = await client.post("/v1/completions", json={**COMPLETION, "stream": False})
            assert resp.status == 200
            assert "pdbench_proxy_kv_params_missing_total 1.0" in await metrics_text(client)
        ((_, db),) = d.received
        assert "kv_transfer_params" not in db and db["max_tokens"] == COMPLETION["max_tokens"] - 1

    run(body)
