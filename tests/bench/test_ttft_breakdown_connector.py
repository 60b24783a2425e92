"""The TTFT breakdown with the bundled connector's per-request records: decode_ms split into the
pull, decode's first step and the rest, per request; the point mean stays for other connectors."""

from __future__ import annotations

import math

import pytest

from harness.bench.client import RequestOutput
from harness.bench.ttft_breakdown import DECODE_SPLIT, decode_split, ttft_breakdown
from harness.report.breakdown import columns, parts


def _outs(*ttfts: float) -> list[RequestOutput]:
    outs = []
    for t in ttfts:
        o = RequestOutput(10, 4)
        o.success, o.ttft = True, t
        outs.append(o)
    return outs


def _rec(decode_ms: float, line: dict | None = None) -> dict:
    rec = {"router_ms": 1.0, "prefill_ms": 50.0, "decode_ms": decode_ms, "first_byte_ms": 51.0 + decode_ms}
    return rec | ({"connector": line} if line is not None else {})


def _line(pull: float, first: float, ok: bool = True) -> dict:
    return {"id": "x", "pull_ms": pull, "first_step_ms": first, "queue_ms": 0.5, "ok": ok}


def test_decode_ms_is_split_per_request_and_the_parts_still_add_up() -> None:
    recs = {"a": _rec(40.0, _line(10.0, 5.0)), "b": _rec(60.0, _line(30.0, 6.0)), "c": _rec(50.0, _line(20.0, 4.0))}
    outs = _outs(0.092, 0.112, 0.102)  # client_ms 1 ms each
    b = ttft_breakdown(outs, ["a", "b", "c"], recs, kv=(99.0, 3))
    assert b["requests"] == 3 and b["adds_up"]["share"] == 1.0, b
    assert b["kv_transfer_ms"]["median"] == 20.0 and b["kv_transfer_ms"]["mean"] == 20.0
    assert b["kv_transfer_ms"]["whole_pull_mean"] == 20.0  # no pull waited for prefill: the same mean
    assert b["decode_first_step_ms"]["median"] == 5.0
    assert b["decode_other_ms"]["median"] == 25.0  # 40-10-5, 60-30-6, 50-20-4: 25, 24, 26
    for key in DECODE_SPLIT:
        assert b[key]["requests"] == 3 and b[key]["source"].startswith("per request"), b[key]
    # Split, not added to: the three parts' means are decode_ms's mean.
    assert sum(b[k]["mean"] for k in DECODE_SPLIT) == pytest.approx(b["decode_ms"]["mean"])
    total = sum(b[k]["mean"] for k in ("router_ms", "prefill_ms", "decode_ms", "client_ms"))
    assert total == pytest.approx(b["ttft_ms"]["mean"])
    # The server's point mean (99 ms here) is not used where requests have their own values.
    assert "transfers" not in b["kv_transfer_ms"] and "decode_first_token_ms" not in b
    assert "kv_transfer_ms" in b["per_request"] and "kv_transfer_ms" not in b["point_means"]


def test_requests_without_a_successful_pull_are_left_out_of_the_split_only() -> None:
    recs = {"a": _rec(40.0, _line(10.0, 5.0)), "b": _rec(60.0, _line(30.0, 6.0, ok=False)), "c": _rec(50.0)}
    b = ttft_breakdown(_outs(0.092, 0.112, 0.102), ["a", "b", "c"], recs, kv=None)
    assert b["requests"] == 3 and b["decode_ms"]["median"] == 50.0
    assert b["kv_transfer_ms"]["requests"] == 1 and b["kv_transfer_ms"]["median"] == 10.0
    assert decode_split(_rec(60.0, _line(30.0, 6.0, ok=False))) is None
    assert decode_split(_rec(60.0, {"ok": True, "pull_ms": None, "first_step_ms": 2.0})) is None
    assert decode_split(_rec(60.0, _line(30.0, 6.0))) == (30.0, 6.0, 24.0)
    # Decode asked before prefill finished (overlapped flow): the wait for prefill is not the transfer.
    early = _line(30.0, 6.0) | {"early": True, "pull_wait_ms": 25.0}
    assert decode_split(_rec(60.0, early)) == (5.0, 6.0, 49.0)
    assert decode_split(_rec(60.0, early | {"pull_wait_ms": None})) is None


def test_a_request_whose_connector_durations_exceed_its_decode_leg_is_not_split_but_counted() -> None:
    # "b": pull 30 + first step 15 > decode leg 40 (the pull began before the leg): other would be -5.
    over = _line(50.0, 15.0) | {"early": True, "pull_wait_ms": 20.0}
    assert decode_split(_rec(40.0, over)) == (30.0, 15.0, -5.0)  # precondition: the raw split is negative
    recs = {"a": _rec(40.0, _line(10.0, 5.0)), "b": _rec(40.0, over), "c": _rec(50.0, _line(20.0, 4.0))}
    b = ttft_breakdown(_outs(0.092, 0.092, 0.102), ["a", "b", "c"], recs, kv=(99.0, 3))
    assert b["requests"] == 3 and b["decode_ms"]["mean"] == pytest.approx(130.0 / 3)  # the leg itself stays
    for key in DECODE_SPLIT:
        assert b[key]["requests"] == 2, b[key]  # left out of all three parts, not clamped in one
    assert b["decode_other_ms"]["median"] == 25.5 and b["kv_transfer_ms"]["median"] == 15.0  # 25, 26; 10, 20
    assert sum(b[k]["median"] for k in DECODE_SPLIT) == pytest.approx(45.0)  # a's and c's legs: 40, 50
    assert b["decode_split_left_out"]["requests"] == 1 and "exceed" in b["decode_split_left_out"]["why"]
    # Every request overran: no per-request split, the point mean stays, the count says why.
    only = ttft_breakdown(_outs(0.092), ["b"], {"b": recs["b"]}, kv=(12.0, 3))
    assert only["decode_split_left_out"]["requests"] == 1 and "decode_other_ms" not in only
    assert "point mean" in only["kv_transfer_ms"]["source"]
    # Requests that fit their leg count nothing as left out.
    assert "decode_split_left_out" not in ttft_breakdown(_outs(0.092), ["a"], {"a": recs["a"]}, kv=None)


def test_other_connectors_keep_the_point_mean_labelled_as_such() -> None:
    b = ttft_breakdown(_outs(0.092), ["a"], {"a": _rec(40.0)}, kv=(12.0, 3))
    assert b["kv_transfer_ms"] == {"mean": 12.0, "transfers": 3, "source": b["kv_transfer_ms"]["source"]}
    assert "point mean" in b["kv_transfer_ms"]["source"] and "kv_transfer_ms" in b["point_means"]
    assert b["decode_first_token_ms"]["median"] == 28.0 and "decode_first_step_ms" not in b
    assert "decode_first_step_ms" not in b["per_request"]


def test_the_report_draws_the_per_request_median() -> None:
    recs = {"a": _rec(40.0, _line(10.0, 5.0)), "b": _rec(60.0, _line(30.0, 6.0)), "c": _rec(50.0, _line(20.0, 4.0))}
    b = ttft_breakdown(_outs(0.092, 0.112, 0.102), ["a", "b", "c"], recs, kv=None)
    p = parts(b)
    assert p["KV transfer"] == 20.0 and p["Decode"] == 30.0  # decode median 50 - pull median 20
    cols = columns(b)
    assert cols["ttft_kv_transfer_ms"] == 20.0 and not math.isnan(cols["ttft_decode_ms"])
