"""The proxy's aggregated mode (--connector none): whole requests to whole instances, the
baseline a disaggregated run is compared with."""

from __future__ import annotations

import asyncio

import pytest
from helpers.proxy_fakes import (
    CHUNKS,
    COMPLETION,
    DONE,
    Fake,
    metrics_text,
    proxy_client,
    read_all,
    start_fake,
    wait_health,
)

from harness.proxy.config import ProxyConfig

pytestmark = pytest.mark.timeout(60)


def test_requests_go_whole_to_one_instance_in_turn() -> None:
    async def body() -> None:
        instances = [Fake("decode"), Fake("decode", healthy=False)]
        servers = [await start_fake(f) for f in instances]
        try:
            config = ProxyConfig(
                connector="none", aggregated=[f.url for f in instances], health_interval_s=0.05, health_failures=1
            )
            async with proxy_client(config) as client:
                health = await wait_health(client, 503, lambda b: b["aggregated_instances"] == 1)
                assert (health["aggregated_instances"], health["expected_aggregated"]) == (1, 2)
                assert "prefill_instances" not in health
                instances[1].healthy = True
                await wait_health(client, 200)
                for _ in range(4):
                    resp = await client.post("/v1/completions", json=COMPLETION)
                    assert resp.status == 200
                    assert await read_all(resp) == b"".join(CHUNKS) + DONE
                    assert resp.headers["X-Request-Id"].startswith("agg-")
                text = await metrics_text(client)
                assert 'pdbench_proxy_expected_instances{role="aggregated"} 2.0' in text
        finally:
            for s in servers:
                await s.close()
        # Each instance served two requests, exactly as the client sent them (no KV params).
        assert [len(f.received) for f in instances] == [2, 2]
        assert all(b == COMPLETION for f in instances for _, b in f.received)

    asyncio.run(body())


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"connector": "none"}, "go with --connector none"),
        (
            {"connector": "nixl", "prefill": ["http://a:1"], "decode": ["http://b:1"], "aggregated": ["http://c:1"]},
            "go with",
        ),
        ({"connector": "none", "aggregated": ["http://c:1"], "decode": ["http://b:1"]}, "not --prefill/--decode"),
    ],
)
def test_aggregated_settings_are_checked(kw: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ProxyConfig(**kw)
