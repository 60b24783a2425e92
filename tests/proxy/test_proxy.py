"""Tests of the PD proxy against fake prefill/decode servers (no vLLM): the NIXL flow,
health, errors, malformed input, disconnects, idle streams, circuit breaker, metrics, CLI.

Each test is a sync function running one coroutine under a hard deadline, so
nothing can hang; the fakes are aiohttp servers on 127.0.0.1 ephemeral ports.
tests/proxy/test_proxy_connectors.py reuses the fakes for the MoRI-IO, Mooncake and
pdbench flows and the routing policies.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import typer
from helpers.proxy_fakes import (
    CHUNKS,
    COMPLETION,
    DEADLINE_S,
    DONE,
    KV,
    NIXL_PREFILL_KV,
    Fake,
    counts,
    metrics_text,
    read_all,
    run,
    stack,
    wait_health,
)
from typer.testing import CliRunner

from benchmarks.common import free_port
from harness.proxy import ProxyConfig
from harness.proxy import proxy_command as proxy_cli


def dead_url() -> str:
    """A URL on which nothing listens (port freed right away)."""
    return f"http://127.0.0.1:{free_port()}"


# -- the NIXL two-phase flow ----------------------------------------------------


def test_prefill_leg_ends_at_its_token_cap() -> None:
    """Connectors hand the KV over only for a length-capped prefill: the prefill leg has no
    stops and masks EOS for its one token; decode gets the request's own."""

    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        req = {**COMPLETION, "stop": ["\n\n"], "stop_token_ids": [2], "min_tokens": 5}
        async with stack([p], [d]) as client:
            resp = await client.post("/v1/completions", json=req)
            assert resp.status == 200
            await read_all(resp)
        ((_, p_body),) = p.received
        ((_, d_body),) = d.received
        assert "stop" not in p_body and "stop_token_ids" not in p_body and p_body["min_tokens"] == 1
        assert (d_body["stop"], d_body["stop_token_ids"], d_body["min_tokens"]) == (["\n\n"], [2], 5)

    asyncio.run(body())


def test_two_phase_flow_bodies_headers_and_stream_order() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        async with stack([p], [d]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer k"})
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert await read_all(resp) == b"".join(CHUNKS) + DONE

        ((p_headers, p_body),) = p.received
        ((d_headers, d_body),) = d.received
        assert p_body == {
            "model": "tiny",
            "prompt": "hello",
            "max_tokens": 1,
            "stream": False,
            "ignore_eos": True,
            "min_tokens": 1,
            "kv_transfer_params": NIXL_PREFILL_KV,
        }
        assert d_body == {**COMPLETION, "kv_transfer_params": KV}
        assert p_headers["X-Request-Id"] == d_headers["X-Request-Id"]
        assert len(p_headers["X-Request-Id"]) >= 32
        assert "X-data-parallel-rank" not in p_headers
        assert p_headers["Authorization"] == d_headers["Authorization"] == "Bearer k"
        assert resp.headers["X-Request-Id"] == p_headers["X-Request-Id"]

    run(body)


def test_chat_without_max_tokens_and_non_streaming() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
        plain = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        async with stack([p], [d]) as client:
            for req in (chat, plain):
                resp = await client.post("/v1/chat/completions", json=req)
                assert resp.status == 200
                assert resp.content_type == "application/json"
                assert (await resp.json())["choices"][0]["text"] == "full"
        assert p.received[0][1]["max_tokens"] == 1
        assert p.received[0][1]["max_completion_tokens"] == 1
        assert p.received[1][1]["max_tokens"] == 1
        assert "max_completion_tokens" not in p.received[1][1]
        assert d.received[0][1] == {**chat, "kv_transfer_params": KV}
        assert d.received[1][1] == {**plain, "kv_transfer_params": KV}  # no max_tokens added
        assert p.received[0][0]["X-Request-Id"] != p.received[1][0]["X-Request-Id"]

    run(body)


def test_client_kv_params_dropped_and_missing_prefill_kv_recomputes() -> None:
    async def body() -> None:
        p, d = Fake("prefill", kv=None), Fake("decode")
        async with stack([p], [d]) as client:
            req = {**COMPLETION, "stream": False, "kv_transfer_params": {"do_remote_prefill": True}}
            resp = await client.post("/v1/completions", json=req)
            assert resp.status == 200
            assert "pdbench_proxy_kv_params_missing_total 1.0" in await metrics_text(client)
        assert p.received[0][1]["kv_transfer_params"] == NIXL_PREFILL_KV
        assert "kv_transfer_params" not in d.received[0][1]  # decode recomputes

    run(body)


def test_round_robin_over_two_decodes_and_two_prefills() -> None:
    async def body() -> None:
        prefills, decodes = [Fake("prefill"), Fake("prefill")], [Fake("decode"), Fake("decode")]
        async with stack(prefills, decodes) as client:
            for _ in range(4):
                resp = await client.post("/v1/completions", json={**COMPLETION, "stream": False})
                assert resp.status == 200
                await resp.read()
        assert [len(f.received) for f in prefills + decodes] == [2, 2, 2, 2]

    run(body)


# -- health, models, metrics ------------------------------------------------------


def test_health_503_until_all_backends_up() -> None:
    async def body() -> None:
        p, d1, d2 = Fake("prefill", healthy=False), Fake("decode", healthy=False), Fake("decode", healthy=False)
        async with stack([p], [d1, d2], wait_ready=False) as client:
            resp = await client.get("/health")
            assert resp.status == 503
            assert counts(await resp.json()) == {
                "status": "not_ready",
                "prefill_instances": 0,
                "decode_instances": 0,
                "expected_prefill": 1,
                "expected_decode": 2,
            }
            # No instance is ready: a request is refused at once, naming the role.
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 503
            err = (await resp.json())["error"]
            assert err["type"] == "no_backend" and "prefill" in err["message"] and err["backend"] == p.url
            p.healthy = d1.healthy = True
            state = await wait_health(client, 503, lambda b: b["prefill_instances"] == 1 and b["decode_instances"] == 1)
            assert state["status"] == "not_ready"
            ready = {b["url"]: b["ready"] for b in state["backends"]}
            assert ready == {p.url: True, d1.url: True, d2.url: False}
            d2.healthy = True
            assert counts(await wait_health(client, 200)) == {
                "status": "ok",
                "prefill_instances": 1,
                "decode_instances": 2,
                "expected_prefill": 1,
                "expected_decode": 2,
            }
            d1.healthy = False  # going down again is noticed too
            assert (await wait_health(client, 503))["decode_instances"] == 1

    run(body)


def test_health_with_expected_counts_above_static_list() -> None:
    async def body() -> None:
        async with stack([Fake("prefill")], [Fake("decode")], wait_ready=False, expected_decode=2) as client:
            state = await wait_health(client, 503, lambda b: b["decode_instances"] == 1)
            assert counts(state) == {
                "status": "not_ready",
                "prefill_instances": 1,
                "decode_instances": 1,
                "expected_prefill": 1,
                "expected_decode": 2,
            }

    run(body)


def test_models_forwarded_to_decode() -> None:
    async def body() -> None:
        async with stack([Fake("prefill")], [Fake("decode")]) as client:
            resp = await client.get("/v1/models")
            assert resp.status == 200
            assert (await resp.json())["data"][0]["id"] == "tiny-decode"

    run(body)


def test_metrics_requests_errors_in_flight_and_backend_latency() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode", stall_after_first=True)
        async with stack([p], [d]) as client:
            ok = await client.post("/v1/completions", json={**COMPLETION, "stream": False})
            assert ok.status == 200
            bad = await client.post("/v1/completions", data=b"{nope")
            assert bad.status == 400
            held = await client.post("/v1/completions", json=COMPLETION)  # stays in flight
            assert await held.content.readany() == CHUNKS[0]
            text = await metrics_text(client)
            held.close()
        assert 'pdbench_proxy_requests_total{endpoint="/v1/completions",status="200"} 1.0' in text
        assert 'pdbench_proxy_requests_total{endpoint="/v1/completions",status="400"} 1.0' in text
        assert 'pdbench_proxy_errors_total{kind="invalid_request_error"} 1.0' in text
        assert "pdbench_proxy_requests_in_flight 1.0" in text
        assert f'pdbench_proxy_backend_latency_seconds_count{{backend="{p.url}",role="prefill"}} 2.0' in text
        assert f'pdbench_proxy_backend_latency_seconds_count{{backend="{d.url}",role="decode"}} 1.0' in text
        assert f'pdbench_proxy_backend_outstanding{{backend="{d.url}",role="decode"}} 1.0' in text
        assert f'pdbench_proxy_backend_up{{backend="{p.url}",role="prefill"}} 1.0' in text
        assert 'pdbench_proxy_ready_instances{role="decode"} 1.0' in text
        assert 'pdbench_proxy_expected_instances{role="prefill"} 1.0' in text

    run(body)


# -- upstream failures and the circuit breaker --------------------------------------


def test_unreachable_static_prefill_is_not_ready_and_skipped() -> None:
    async def body() -> None:
        url = dead_url()
        p, d = Fake("prefill"), Fake("decode")
        async with stack([p], [d], extra_prefill_urls=(url,), wait_ready=False) as client:
            state = await wait_health(client, 503, lambda b: b["prefill_instances"] == 1 and b["decode_instances"] == 1)
            assert [b["ready"] for b in state["backends"] if b["url"] == url] == [False]
            for _ in range(3):  # every request goes to the live prefill
                resp = await client.post("/v1/completions", json=COMPLETION)
                assert resp.status == 200
                await resp.read()
        assert len(p.received) == 3

    run(body)


def test_dead_backend_gives_502_naming_it_then_is_taken_out() -> None:
    async def body() -> None:
        p1, p2, d = Fake("prefill"), Fake("prefill"), Fake("decode")
        async with stack([p1, p2], [d], breaker_failures=2, health_failures=50) as client:
            assert p1.server is not None
            await p1.server.close()  # dies after it was found healthy
            statuses = []
            for _ in range(6):
                resp = await client.post("/v1/completions", json=COMPLETION)
                statuses.append(resp.status)
                if resp.status == 502:
                    err = (await resp.json())["error"]
                    assert err["backend"] == p1.url
                    assert err["type"] == "connection_error"
                    assert "prefill failed" in err["message"]
                else:
                    await resp.read()
            # Round-robin hits the dead one on requests 1 and 3; then it is out.
            assert statuses == [502, 200, 502, 200, 200, 200]
            state = await (await client.get("/health")).json()
            (dead,) = [b for b in state["backends"] if b["url"] == p1.url]
            assert dead["circuit_open"] is True and dead["ready"] is False
            assert (
                f'pdbench_proxy_backend_failures_total{{backend="{p1.url}",role="prefill"}} 2.0'
                in await metrics_text(client)
            )

    run(body)


def test_circuit_breaker_takes_out_failing_decode_and_readmits_when_healthy() -> None:
    async def body() -> None:
        good, bad = Fake("decode"), Fake("decode", status=500)
        async with stack([Fake("prefill")], [good, bad], breaker_failures=2, breaker_min_open_s=0.2) as client:
            for _ in range(8):
                resp = await client.post("/v1/completions", json=COMPLETION)
                await resp.read()
            assert len(bad.received) == 2  # then it was taken out
            assert len(good.received) == 6
            (out,) = [b for b in (await (await client.get("/health")).json())["backends"] if b["url"] == bad.url]
            assert out["circuit_open"] is True
            # While its health check fails it stays out, past the minimum time.
            bad.healthy = False
            await asyncio.sleep(0.4)
            state = await (await client.get("/health")).json()
            assert [b["circuit_open"] for b in state["backends"] if b["url"] == bad.url] == [True]
            bad.healthy, bad.status = True, 200
            await wait_health(client, 200, lambda b: not any(x["circuit_open"] for x in b["backends"]))
            for _ in range(2):
                await (await client.post("/v1/completions", json=COMPLETION)).read()
            assert len(bad.received) == 3  # back in the rotation

    run(body)


def test_prefill_4xx_passed_through_with_backend() -> None:
    async def body() -> None:
        p, d = Fake("prefill", status=400), Fake("decode")
        async with stack([p], [d], breaker_failures=1) as client:
            for _ in range(2):  # a client error never opens the breaker
                resp = await client.post("/v1/completions", json=COMPLETION)
                assert resp.status == 400
                err = (await resp.json())["error"]
                assert err["backend"] == p.url
                assert "prompt too long" in err["message"]
        assert d.received == []

    run(body)


def test_prefill_5xx_gives_502() -> None:
    async def body() -> None:
        p = Fake("prefill", status=500)
        async with stack([p], [Fake("decode")]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 502
            assert (await resp.json())["error"]["backend"] == p.url

    run(body)


def test_decode_5xx_gives_502_naming_decode() -> None:
    async def body() -> None:
        d = Fake("decode", status=503)
        async with stack([Fake("prefill")], [d]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 502
            err = (await resp.json())["error"]
            assert err["backend"] == d.url and "decode returned HTTP 503" in err["message"]

    run(body)


# -- malformed input ------------------------------------------------------------------

BAD_BODIES: list[tuple[str, bytes]] = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b"\xff\xfe"),
    ("/v1/completions", b""),
    ("/v1/completions", b'"just a string"'),
    ("/v1/completions", json.dumps({**COMPLETION, "max_tokens": "7"}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "max_tokens": True}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "max_tokens": -1}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "max_tokens": 0}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "max_tokens": 1.5}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "min_tokens": "3"}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "stream": "yes"}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "stream_options": "usage"}).encode()),
    ("/v1/completions", json.dumps({**COMPLETION, "model": 7}).encode()),
    ("/v1/completions", json.dumps({"model": "tiny", "max_tokens": 3}).encode()),  # no prompt
    ("/v1/completions", json.dumps({"model": "tiny", "prompt": 42}).encode()),
    ("/v1/completions", json.dumps({"model": "tiny", "prompt": []}).encode()),
    ("/v1/chat/completions", json.dumps({"model": "tiny", "messages": "hi"}).encode()),
    ("/v1/chat/completions", json.dumps({"model": "tiny", "messages": ["hi"]}).encode()),
    ("/v1/chat/completions", json.dumps({"model": "tiny", "messages": []}).encode()),
    ("/v1/chat/completions", json.dumps({"model": "tiny"}).encode()),
    (
        "/v1/chat/completions",
        json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "9"}
        ).encode(),
    ),
]


@pytest.mark.parametrize(("path", "raw"), BAD_BODIES, ids=[f"{i}" for i in range(len(BAD_BODIES))])
def test_malformed_body_gives_400(path: str, raw: bytes) -> None:
    async def body() -> None:
        p = Fake("prefill")
        async with stack([p], [Fake("decode")]) as client:
            resp = await client.post(path, data=raw, headers={"Content-Type": "application/json"})
            assert resp.status == 400
            err = (await resp.json())["error"]
            assert err["type"] == "invalid_request_error" and err["message"]
            ok = await client.post("/v1/completions", json=COMPLETION)  # still serving
            assert ok.status == 200
            await ok.read()
        assert len(p.received) == 1

    run(body)


def test_oversized_body_gives_413_with_and_without_length() -> None:
    async def body() -> None:
        p = Fake("prefill")
        async with stack([p], [Fake("decode")], max_body_bytes=4096) as client:
            big = json.dumps({**COMPLETION, "prompt": "x" * 10_000}).encode()
            resp = await client.post("/v1/completions", data=big, headers={"Content-Type": "application/json"})
            assert resp.status == 413
            assert (await resp.json())["error"]["type"] == "request_too_large"

            async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to check
                for i in range(0, len(big), 1000):
                    yield big[i : i + 1000]

            resp = await client.post("/v1/completions", data=chunks())
            assert resp.status == 413
            assert (await resp.json())["error"]["type"] == "request_too_large"
            ok = await client.post("/v1/completions", json=COMPLETION)
            assert ok.status == 200
            await ok.read()
        assert len(p.received) == 1

    run(body)


def test_unknown_path_and_method() -> None:
    async def body() -> None:
        async with stack([Fake("prefill")], [Fake("decode")]) as client:
            assert (await client.get("/v1/completions")).status == 405
            assert (await client.post("/v1/embeddings", json={})).status == 404

    run(body)


# -- streams: idle timeout and disconnects ------------------------------------------------


def test_stalled_decode_is_aborted_after_idle_timeout() -> None:
    async def body() -> None:
        d = Fake("decode", stall_after_first=True)
        async with stack([Fake("prefill")], [d], stream_idle_timeout_s=0.3) as client:
            start = time.monotonic()
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 200
            got = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in resp.content.iter_any():
                    got += chunk
            assert time.monotonic() - start < 5
            assert got.startswith(CHUNKS[0])
            assert b"stream_idle_timeout" in got and d.url.encode() in got and DONE not in got
            await asyncio.wait_for(d.cancelled.wait(), 5)  # upstream request was dropped
            assert 'pdbench_proxy_errors_total{kind="decode_stream_idle_timeout"} 1.0' in await metrics_text(client)

    run(body)


def test_client_disconnect_cancels_decode() -> None:
    async def body() -> None:
        d = Fake("decode", stall_after_first=True)
        async with stack([Fake("prefill")], [d]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert await resp.content.readany() == CHUNKS[0]
            resp.close()  # drop the connection mid-stream
            await asyncio.wait_for(d.cancelled.wait(), 5)
            state = await wait_health(client, 200, lambda b: all(x["outstanding"] == 0 for x in b["backends"]))
            assert state["decode_instances"] == 1

    run(body)


def test_client_disconnect_during_prefill_cancels_prefill() -> None:
    async def body() -> None:
        p, d = Fake("prefill", stall_before_headers=True), Fake("decode")
        async with stack([p], [d]) as client:
            task = asyncio.ensure_future(client.post("/v1/completions", json=COMPLETION))
            await asyncio.wait_for(p.started.wait(), 5)
            task.cancel()  # the client gives up while prefill runs
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.wait_for(p.cancelled.wait(), 5)
        assert d.received == []

    run(body)


# -- CLI ------------------------------------------------------------------------------------


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("proxy")(proxy_cli.proxy_command)
    app.command("other")(lambda: None)  # keep "proxy" a subcommand, as in harness.cli
    return app


def test_cli_builds_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ProxyConfig] = []
    monkeypatch.setattr(proxy_cli, "serve", seen.append)
    args = [
        "proxy",
        "--port",
        "31000",
        "--prefill",
        "http://10.0.0.1:8100/",
        "--prefill",
        "10.0.0.2:8100",
        "--decode",
        "http://10.0.0.3:8200",
        "--stream-idle-timeout-s",
        "5",
        "--policy",
        "prefix_hash",
        "--expected-decode",
        "2",
    ]
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert cfg.port == 31000 and cfg.host == "127.0.0.1"  # never every interface by default
    assert cfg.moriio_host == "127.0.0.1"
    assert cfg.prefill == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]
    assert cfg.decode == ["http://10.0.0.3:8200"]
    assert (cfg.request_timeout_s, cfg.stream_idle_timeout_s, cfg.health_interval_s) == (600, 5, 2)
    assert cfg.policy == "prefix_hash" and (cfg.want_prefill, cfg.want_decode) == (2, 2)


def test_cli_moriio_needs_no_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ProxyConfig] = []
    monkeypatch.setattr(proxy_cli, "serve", seen.append)
    args = [
        "proxy",
        "--connector",
        "moriio",
        "--moriio-port",
        "36367",
        "--expected-prefill",
        "2",
        "--expected-decode",
        "3",
        "--moriio-mode",
        "read",
        "--host",
        "127.0.0.1",
        "--moriio-host",
        "10.0.0.7",
    ]
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert (cfg.connector, cfg.moriio_port, cfg.moriio_mode) == ("moriio", 36367, "read")
    assert (cfg.host, cfg.moriio_host) == ("127.0.0.1", "10.0.0.7")
    assert (cfg.want_prefill, cfg.want_decode) == (2, 3)


@pytest.mark.parametrize(
    "args",
    [
        ["--prefill", "http://a:1", "--decode", "http://b:2", "--connector", "no-such-connector"],
        ["--decode", "http://b:2"],
        ["--prefill", "http://a:1", "--decode", "http://b:2", "--request-timeout-s", "0"],
        ["--prefill", "http://a:1", "--decode", "http://b:2", "--policy", "random"],
        ["--connector", "moriio"],  # no registration port
        ["--connector", "moriio", "--moriio-port", "1", "--moriio-mode", "push"],
        ["--prefill", "http://a:1", "--decode", "http://b:2", "--bootstrap-port", "8998"],  # not mooncake
        ["--prefill", "ftp://a:1", "--decode", "http://b:2"],
        ["--connector", "moriio", "--moriio-port", "36367", "--prefill", "http://a:1"],  # they register
        ["--connector", "moriio", "--moriio-port", "36367", "--workers", "2"],
    ],
)
def test_cli_rejects_bad_options(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setattr(proxy_cli, "serve", lambda cfg: pytest.fail("must not serve"))
    result = CliRunner().invoke(_cli(), ["proxy", *args])
    assert result.exit_code == 2
    assert "Error" in result.output


# -- listening address ----------------------------------------------------------------------


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except ConnectionRefusedError:
        return False


@pytest.mark.parametrize("host, workers", [(None, 1), ("127.0.0.2", 2)])
def test_proxy_listens_only_on_the_address_it_was_given(host: str | None, workers: int) -> None:
    """127.0.0.1 and 127.0.0.2 are two local addresses (Linux loopback is 127/8): a proxy
    bound to one must refuse connections on the other, as it would on the node's NIC."""
    import subprocess
    import sys

    port = free_port()
    args = [
        sys.executable,
        "-m",
        "harness",
        "proxy",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--prefill",
        dead_url(),
        "--decode",
        dead_url(),
        "--health-interval-s",
        "30",
    ]
    if host is not None:
        args += ["--host", host]
    want, other = (host or "127.0.0.1"), ("127.0.0.1" if host else "127.0.0.2")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not _accepts(want, port):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the proxy never listened"
            time.sleep(0.1)
        assert not _accepts(other, port)
    finally:
        proc.terminate()
        proc.wait(10)
