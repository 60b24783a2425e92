"""The bottleneck verdict's rules (harness.validity.bottleneck) from synthetic inputs, one test per
verdict, and the bench side that feeds them: each role's point means from real vLLM 0.32 scrapes
and the sweep's growth baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harness.bench.client import RequestOutput
from harness.bench.results import BenchResult
from harness.bench.ttft_breakdown import judge_point, role_timings, ttft_breakdown
from harness.rundir.bottleneck_summary import Baseline, BottleneckSummary, RoleTiming
from harness.validity.bottleneck import CLIENT_SHARE, GROWTH, QUEUE_OVER_COMPUTE, ROUTER_SHARE, judge

pytestmark = pytest.mark.timeout(30)

QUIET_CLIENT: dict[str, Any] = {"cpu_busy": [0.2], "loop_lag_ms": {"median": 0.1, "p99": 0.5}, "warnings": []}
# Per-request means (ms) of a 1P1D point at low load: prefill leg 60, decode leg 40 (10 of it KV).
LOW = {"ttft_ms": 102.0, "router_ms": 1.0, "prefill_ms": 60.0, "decode_ms": 40.0, "client_ms": 1.0}
ROLES_LOW = {
    "prefill": RoleTiming(requests=12, queue_ms=0.5, compute_ms=50.0, tpot_ms=0.0),
    "decode": RoleTiming(requests=12, queue_ms=20.0, compute_ms=15.0, tpot_ms=12.0),
}
BASE = Baseline(concurrency=1, roles=ROLES_LOW, kv_transfer_ms=10.0)


def _judge(
    parts: dict[str, float] | None = LOW,
    roles: dict[str, RoleTiming] = ROLES_LOW,
    kv: float | None = 10.0,
    client: dict[str, Any] = QUIET_CLIENT,
    baseline: Baseline | None = BASE,
) -> BottleneckSummary:
    return judge(parts, roles, kv, 12.0, client, baseline, e2el_ms=None)  # TTFT's parts alone


def test_low_load_is_not_saturated_and_names_the_dominant_part() -> None:
    b = _judge(baseline=None)
    assert b.verdict == "not saturated" and b.saturated == [] and b.reasons == []
    assert b.dominant == "prefill"
    shares = b.evidence.shares
    assert shares["prefill"] == pytest.approx(60 / 102, abs=1e-4)
    assert shares["kv_transfer"] == pytest.approx(10 / 102, abs=1e-4)
    assert shares["decode"] == pytest.approx(30 / 102, abs=1e-4)  # the decode leg less the KV mean
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    # The same numbers against themselves as a baseline: growth 1x, still nothing fires.
    same = _judge()
    assert same.verdict == "not saturated" and same.evidence.growth == {
        "prefill": 1.0,
        "decode": 1.0,
        "decode_wait": 1.0,
    }


def test_prefill_bound_by_its_queue_without_a_baseline() -> None:
    queued = ROLES_LOW | {"prefill": RoleTiming(requests=12, queue_ms=QUEUE_OVER_COMPUTE * 50.0, compute_ms=50.0)}
    b = _judge(roles=queued, baseline=None)
    assert b.verdict == "prefill-bound" and b.saturated == ["prefill"]
    assert "queue 25.0 ms >= 0.5 x compute 50.0 ms" in b.reasons[0]
    just_under = ROLES_LOW | {"prefill": RoleTiming(requests=12, queue_ms=24.9, compute_ms=50.0)}
    assert _judge(roles=just_under, baseline=None).verdict == "not saturated"


def test_prefill_bound_by_growth_when_batching_hides_the_queue() -> None:
    # vLLM batches the prompts: queue stays ~0, compute per request grows (1P2D on CPU: 101 -> 434 ms).
    roles = ROLES_LOW | {"prefill": RoleTiming(requests=36, queue_ms=0.5, compute_ms=GROWTH * 50.5 - 0.5)}
    parts = LOW | {"ttft_ms": 142.0, "prefill_ms": 100.0}
    b = _judge(parts=parts, roles=roles)
    assert b.verdict == "prefill-bound" and b.evidence.growth["prefill"] == 2.0
    assert "queue + compute grew 2.0x over C=1" in b.reasons[0] and b.evidence.baseline_concurrency == 1
    under = ROLES_LOW | {"prefill": RoleTiming(requests=36, queue_ms=0.5, compute_ms=GROWTH * 50.5 - 1.0)}
    assert _judge(parts=parts, roles=under).verdict == "not saturated"


def test_decode_bound_by_tpot_growth() -> None:
    roles = ROLES_LOW | {"decode": RoleTiming(requests=36, queue_ms=20.0, compute_ms=40.0, tpot_ms=30.0)}
    parts = LOW | {"ttft_ms": 132.0, "decode_ms": 70.0}
    b = _judge(parts=parts, roles=roles)
    assert b.verdict == "decode-bound" and b.saturated == ["decode"]
    assert b.evidence.growth["decode"] == 2.5 and "TPOT grew 2.5x over C=1" in b.reasons[0]


def test_transfer_bound_when_the_kv_transfer_grows_and_matters() -> None:
    parts = LOW | {"ttft_ms": 132.0, "decode_ms": 70.0}
    b = _judge(parts=parts, kv=40.0)
    assert b.verdict == "transfer-bound" and b.saturated == ["transfer"]
    assert b.evidence.kv_growth == 4.0 and b.dominant == "prefill"
    # The same growth in a transfer under a tenth of TTFT is not what limits TTFT.
    small = _judge(parts=LOW | {"ttft_ms": 1002.0, "prefill_ms": 900.0, "decode_ms": 100.0}, kv=40.0)
    assert "transfer" not in small.saturated


def test_of_several_saturated_servers_the_largest_part_of_ttft_wins() -> None:
    roles = {
        "prefill": RoleTiming(requests=36, queue_ms=0.5, compute_ms=160.0),
        "decode": RoleTiming(requests=36, queue_ms=20.0, compute_ms=40.0, tpot_ms=36.0),
    }
    prefill_heavy = _judge(parts=LOW | {"ttft_ms": 272.0, "prefill_ms": 200.0, "decode_ms": 70.0}, roles=roles)
    assert prefill_heavy.saturated == ["prefill", "decode"] and prefill_heavy.verdict == "prefill-bound"
    decode_heavy = _judge(parts=LOW | {"ttft_ms": 272.0, "prefill_ms": 70.0, "decode_ms": 200.0}, roles=roles)
    assert decode_heavy.verdict == "decode-bound"
    # Without the proxy's parts the largest growth decides: prefill 3.2x, decode TPOT 3x -> prefill.
    assert _judge(parts=None, roles=roles).verdict == "prefill-bound"
    assert _judge(parts=None, roles=roles).dominant is None


# Real vLLM, tiny-fp32-cpu-nixl-1p1d (prefill on core 0, decode on core 1), 2026-11-26: the point means
# the verdict read at C=32 of ISL 16 / OSL 256 (decode's TPOT 6.0 -> 16.5 ms) and at C=8 of
# ISL 2048 / OSL 2, each against its C=1.
LONG_OUT_C1 = {
    "prefill": RoleTiming(requests=8, queue_ms=0.0, compute_ms=8.2, tpot_ms=0.0),
    "decode": RoleTiming(requests=8, queue_ms=11.3, compute_ms=8.5, tpot_ms=6.0),
}
LONG_OUT_C32 = {
    "prefill": RoleTiming(requests=68, queue_ms=0.04, compute_ms=36.3, tpot_ms=0.0),
    "decode": RoleTiming(requests=68, queue_ms=26.3, compute_ms=24.1, tpot_ms=16.5),
}
LONG_OUT_PARTS = {"ttft_ms": 222.9, "router_ms": 0.02, "prefill_ms": 97.9, "decode_ms": 124.1, "client_ms": 0.9}
LONG_IN_C1 = {
    "prefill": RoleTiming(requests=12, queue_ms=32.1, compute_ms=265.8, tpot_ms=0.0),
    "decode": RoleTiming(requests=12, queue_ms=27.1, compute_ms=21.9, tpot_ms=23.9),
}
LONG_IN_C8 = {
    "prefill": RoleTiming(requests=36, queue_ms=2117.5, compute_ms=814.3, tpot_ms=0.0),
    "decode": RoleTiming(requests=36, queue_ms=28.9, compute_ms=20.8, tpot_ms=20.9),
}
LONG_IN_PARTS = {"ttft_ms": 3369.6, "router_ms": 0.1, "prefill_ms": 3293.5, "decode_ms": 74.6, "client_ms": 1.4}


def test_a_long_output_job_is_decode_bound_by_the_requests_whole_time() -> None:
    """Prefill's growth rule fires too (the closed loop's prompts arrive together), and by TTFT's
    shares alone decode wins by a hair; a request's time after its first token is decode's, and
    with it decode wins by a mile."""
    base = Baseline(concurrency=1, roles=LONG_OUT_C1, kv_transfer_ms=3.2)
    args = (LONG_OUT_PARTS, LONG_OUT_C32, 5.2, 16.5, QUIET_CLIENT, base)
    b = judge(*args, e2el_ms=4435.0)
    assert b.saturated == ["prefill", "decode"] and b.verdict == "decode-bound"
    assert b.evidence.growth == {"prefill": pytest.approx(4.43, abs=0.01), "decode": 2.75, "decode_wait": 2.723}
    shares = b.evidence.shares
    assert shares["decode"] - shares["prefill"] < 0.1  # TTFT alone: 0.53 against 0.44
    # Had prefill's share of TTFT been the larger, the request's whole time still says decode.
    swapped = LONG_OUT_PARTS | {"prefill_ms": 124.1, "decode_ms": 97.9}
    assert judge(swapped, *args[1:], e2el_ms=4435.0).verdict == "decode-bound"
    assert judge(swapped, *args[1:], e2el_ms=None).verdict == "prefill-bound"  # without E2EL: TTFT's shares
    assert b.evidence.e2el_ms == 4435.0


def test_decode_bound_by_the_wait_for_its_full_steps() -> None:
    """Real vLLM, ISL 16 / OSL 256, C=64 against C=1 on a loaded machine: TPOT grew 3.6x, the wait
    beyond the KV transfer 5.1x; the wait alone says decode is full when TPOT grows less."""
    c1 = LONG_OUT_C1 | {"decode": RoleTiming(requests=4, queue_ms=15.2, compute_ms=12.6, tpot_ms=7.9)}
    c64 = LONG_OUT_C32 | {"decode": RoleTiming(requests=128, queue_ms=65.5, compute_ms=48.8, tpot_ms=28.7)}
    base = Baseline(concurrency=1, roles=c1, kv_transfer_ms=8.8)
    b = judge(LONG_OUT_PARTS, c64, 16.9, 28.7, QUIET_CLIENT, base, e2el_ms=7701.0)
    assert b.verdict == "decode-bound" and b.evidence.growth["decode_wait"] == pytest.approx(5.13, abs=0.01)
    assert "decode: queue + first step less the KV mean grew 5.1x over C=1 (>= 2x)" in b.reasons
    slow_tpot = c64 | {"decode": RoleTiming(requests=128, queue_ms=65.5, compute_ms=48.8, tpot_ms=GROWTH * 7.9 - 0.1)}
    only_wait = judge(LONG_OUT_PARTS, slow_tpot, 16.9, 15.7, QUIET_CLIENT, base, e2el_ms=4000.0)
    assert "decode" in only_wait.saturated and not any("TPOT" in x for x in only_wait.reasons)


def test_a_long_prompt_job_is_prefill_bound_whatever_its_outputs() -> None:
    base = Baseline(concurrency=1, roles=LONG_IN_C1, kv_transfer_ms=15.5)
    b = judge(LONG_IN_PARTS, LONG_IN_C8, 18.1, 17.5, QUIET_CLIENT, base, e2el_ms=3387.0)
    assert b.saturated == ["prefill"] and b.verdict == "prefill-bound" and b.dominant == "prefill"
    assert b.evidence.growth == {
        "prefill": pytest.approx(9.84, abs=0.01),
        "decode": pytest.approx(0.87, abs=0.01),
        "decode_wait": 0.943,
    }
    assert "queue 2117.5 ms >= 0.5 x compute 814.3 ms" in b.reasons[0]


def test_router_bound_when_the_proxy_takes_its_share() -> None:
    parts = LOW | {"ttft_ms": 102.0 + 30.0, "router_ms": 31.0}
    assert ROUTER_SHARE <= 31.0 / 132.0
    b = _judge(parts=parts)
    assert b.verdict == "router-bound" and "proxy's own time 23% of TTFT" in b.reasons[0]
    assert b.evidence.proxy_ms == 31.0


def test_client_bound_by_its_cpu_its_lag_or_its_share_and_first_of_all() -> None:
    busy = QUIET_CLIENT | {"cpu_busy": [0.5, 0.95], "warnings": ["load process 1 at 95% CPU: the client may have been"]}
    roles = ROLES_LOW | {"prefill": RoleTiming(requests=12, queue_ms=40.0, compute_ms=50.0)}
    b = _judge(roles=roles, client=busy)
    assert b.saturated == ["client", "prefill"] and b.verdict == "client-bound"  # the client's delay is in TTFT
    assert "a load process at 95% CPU (>= 90%)" in b.reasons[0]
    assert b.evidence.client_cpu_busy == 0.95 and b.evidence.client_warnings == busy["warnings"]
    share = _judge(parts=LOW | {"ttft_ms": 132.0, "client_ms": 31.0})
    assert CLIENT_SHARE <= 31.0 / 132.0 and share.verdict == "client-bound"
    # A lag the client section warns about (p99 over 5 ms) flags the measurement, not the limit ...
    warned = QUIET_CLIENT | {"loop_lag_ms": {"median": 1.0, "p99": 5.7}, "warnings": ["event-loop lag p99 5.7 ms"]}
    assert _judge(client=warned).verdict == "not saturated"
    # ... until it is a tenth of TTFT.
    lagging = warned | {"loop_lag_ms": {"median": 3.0, "p99": 10.3}}
    lag = _judge(client=lagging)
    assert lag.verdict == "client-bound" and "event-loop lag p99 10.3 ms, 10% of TTFT" in lag.reasons[0]


def test_an_aggregated_instance_is_judged_as_both_sides() -> None:
    low = {"aggregated": RoleTiming(requests=12, queue_ms=0.5, compute_ms=60.0, tpot_ms=10.0)}
    base = Baseline(concurrency=1, roles=low)
    parts = {"ttft_ms": 100.0, "router_ms": 1.0, "decode_ms": 98.0, "client_ms": 1.0}  # one leg: all "decode"
    assert judge(parts, low, None, 10.0, QUIET_CLIENT, base, e2el_ms=None).verdict == "not saturated"
    busy_decode = {"aggregated": RoleTiming(requests=36, queue_ms=0.5, compute_ms=60.0, tpot_ms=25.0)}
    b = judge(parts, busy_decode, None, 25.0, QUIET_CLIENT, base, e2el_ms=None)
    assert b.verdict == "decode-bound" and b.evidence.growth == {"prefill": 1.0, "decode": 2.5}
    # Its queue + compute is the part of the leg before the first token: prefill's, and it dominates.
    busy_prefill = {"aggregated": RoleTiming(requests=36, queue_ms=40.0, compute_ms=150.0, tpot_ms=25.0)}
    b = judge(
        parts | {"ttft_ms": 230.0, "decode_ms": 228.0}, busy_prefill, None, 25.0, QUIET_CLIENT, base, e2el_ms=None
    )
    assert b.saturated == ["prefill", "decode"] and b.verdict == "prefill-bound"
    assert b.dominant == "decode"  # the parts as measured: the proxy sees one leg


# Real vLLM 0.32 (CPU) lines of a 1P2D point: before/after of prefill-0, decode-0, decode-1.
def _prom(queue: tuple[float, float], prefill: tuple[float, float], tpot: tuple[float, float]) -> str:
    lines = []
    for name, (s, c) in (
        ("request_queue_time_seconds", queue),
        ("request_prefill_time_seconds", prefill),
        ("request_time_per_output_token_seconds", tpot),
    ):
        lines += [
            f"# TYPE vllm:{name} histogram",
            f'vllm:{name}_sum{{engine="0",model_name="tiny"}} {s}',
            f'vllm:{name}_count{{engine="0",model_name="tiny"}} {c}',
        ]
    return "\n".join(lines) + "\n"


def test_role_timings_are_point_means_of_vllms_histograms_over_instances() -> None:
    scrapes = [
        (
            "prefill",
            _prom((4.128462543994829, 82), (18.09585445900302, 82), (0.7458093107732916, 82)),
            _prom((7.770415681960003, 118), (33.72633762205078, 118), (0.7458093107732916, 118)),
        ),
        (
            "decode",
            _prom((1.5942385659946012, 31), (0.892123169011029, 31), (0.636080408807292, 31)),
            _prom((2.5441892719827592, 49), (1.557681054022396, 49), (1.1492675211625138, 49)),
        ),
        (
            "decode",
            _prom((1.0042068189795827, 31), (0.8316197379899677, 31), (0.6276947343872198, 31)),
            _prom((2.555390956978954, 49), (1.5165921000079834, 49), (1.16282685845128, 49)),
        ),
        ("proxy", "", "pdbench_proxy_requests_total 3\n"),
    ]
    t = role_timings(scrapes)
    assert set(t) == {"prefill", "decode"}
    assert t["prefill"].requests == 36
    assert t["prefill"].queue_ms == pytest.approx(101.2, abs=0.1)
    assert t["prefill"].compute_ms == pytest.approx(434.2, abs=0.1)
    assert t["prefill"].tpot_ms == 0.0  # one token per prefill request
    assert t["decode"].requests == 36  # both instances summed
    assert t["decode"].queue_ms == pytest.approx((0.950 + 1.551) / 36 * 1000, abs=0.1)
    assert t["decode"].tpot_ms == pytest.approx((0.513 + 0.535) / 36 * 1000, abs=0.2)
    # A server that exports none of the histograms gives no role at all, never zeros.
    assert role_timings([("decode", "", "vllm:num_requests_running 0\n")]) == {}
    # One restarted during the point (its counters below the first scrape's) gives none either.
    restarted = _prom((2.5, 49), (1.5, 49), (1.1, 49)), _prom((0.1, 2), (0.05, 2), (0.02, 2))
    assert role_timings([("decode", *restarted)]) == {}


def test_growth_is_against_the_lowest_concurrency_measured_so_far_per_shape() -> None:
    bases: dict[str | None, Baseline] = {}
    low = {"decode": RoleTiming(requests=12, queue_ms=20.0, compute_ms=15.0, tpot_ms=12.0)}
    high = {"decode": RoleTiming(requests=36, queue_ms=20.0, compute_ms=15.0, tpot_ms=30.0)}

    def point(c: int, roles: dict[str, RoleTiming], shape: str | None = None) -> dict[str, Any]:
        return judge_point(c, None, roles, (10.0, 12), 12.0, QUIET_CLIENT, bases, shape, e2el_ms=400.0)

    first = point(4, low)
    assert first["evidence"]["baseline_concurrency"] is None and first["verdict"] == "not saturated"
    assert point(16, high)["verdict"] == "decode-bound"  # against C=4
    assert point(2, high)["evidence"]["baseline_concurrency"] is None  # lower than the baseline: none
    assert bases[None].concurrency == 2
    assert point(16, high)["verdict"] == "not saturated"  # against C=2, same TPOT
    assert point(8, high, "shape-b")["evidence"]["baseline_concurrency"] is None  # another shape
    BottleneckSummary.model_validate(first)  # the section is the report's model


def _breakdown(
    decode_ms: float, pull_ms: float | None, kv: tuple[float, int], early_wait_ms: float | None = None
) -> dict[str, Any]:
    """The TTFT breakdown of three requests, prefill 50 ms, router and client 1 ms each, with this
    decode leg; `pull_ms`: each one's pull as the bundled connector timed it (first step 5 ms), or
    None for a connector without per-request records; `early_wait_ms`: the pull's wait for prefill
    in the overlapped flow."""
    outs = []
    for _ in range(3):
        o = RequestOutput(10, 4)
        o.success, o.ttft = True, (52.0 + decode_ms + 1.0) / 1000.0
        outs.append(o)
    rec: dict[str, Any] = {
        "router_ms": 1.0,
        "prefill_ms": 50.0,
        "decode_ms": decode_ms,
        "first_byte_ms": 51.0 + decode_ms,
    }
    if pull_ms is not None:
        rec["connector"] = {"id": "x", "ok": True, "pull_ms": pull_ms, "first_step_ms": 5.0}
        if early_wait_ms is not None:
            rec["connector"] |= {"early": True, "pull_wait_ms": early_wait_ms}
    return ttft_breakdown(outs, ["a", "b", "c"], dict.fromkeys("abc", rec), kv)


def test_the_decode_wait_rule_takes_the_per_request_transfer_where_the_connector_gave_one() -> None:
    """Decode's queue grew from 20 to 60 ms, and so did each request's own pull (10 -> 40 ms) while
    the servers' point mean stayed at 10 ms: the wait beyond the transfer did not grow."""
    low = {"decode": RoleTiming(requests=12, queue_ms=20.0, compute_ms=15.0, tpot_ms=12.0)}
    high = {"decode": RoleTiming(requests=36, queue_ms=60.0, compute_ms=15.0, tpot_ms=12.0)}
    point_mean = (10.0, 36)

    def sweep(low_b: dict[str, Any] | None, high_b: dict[str, Any] | None) -> dict[str, Any]:
        bases: dict[str | None, Baseline] = {}
        judge_point(1, low_b, low, point_mean, 12.0, QUIET_CLIENT, bases, None, e2el_ms=400.0)
        return judge_point(16, high_b, high, point_mean, 12.0, QUIET_CLIENT, bases, None, e2el_ms=400.0)

    high_b = _breakdown(80.0, 40.0, point_mean)
    assert high_b["kv_transfer_ms"]["requests"] == 3 and high_b["kv_transfer_ms"]["mean"] == 40.0  # precondition
    timed = sweep(_breakdown(40.0, 10.0, point_mean), high_b)
    assert timed["evidence"]["kv_transfer_ms"] == 40.0
    assert timed["evidence"]["growth"]["decode_wait"] == 1.4  # (60 - 40 + 15) / (20 - 10 + 15)
    assert not any("decode" in r for r in timed["reasons"]), timed["reasons"]
    assert "transfer" in timed["saturated"]  # 4x, and 40 of 133 ms TTFT
    # Overlapped flow: decode's queue holds the pull's wait for prefill too, so the verdict takes the
    # whole pull (40 ms), not the split's transfer from prefill's answer on (40 - 30 = 10 ms).
    early = _breakdown(80.0, 40.0, point_mean, early_wait_ms=30.0)
    assert early["kv_transfer_ms"]["mean"] == 10.0 and early["kv_transfer_ms"]["whole_pull_mean"] == 40.0
    overlapped = sweep(_breakdown(40.0, 10.0, point_mean, early_wait_ms=0.0), early)
    assert overlapped["evidence"]["kv_transfer_ms"] == 40.0 and overlapped["evidence"]["growth"]["decode_wait"] == 1.4
    # Without per-request transfers (another connector; or no proxy records) the servers' point mean stays.
    untimed = _breakdown(80.0, None, point_mean)
    assert "transfers" in untimed["kv_transfer_ms"]  # precondition: the breakdown's point mean
    for low_b, high_b in ((_breakdown(40.0, None, point_mean), untimed), (None, None)):
        by_mean = sweep(low_b, high_b)
        assert by_mean["evidence"]["kv_transfer_ms"] == 10.0
        assert by_mean["evidence"]["growth"]["decode_wait"] == 2.6  # (60 - 10 + 15) / (20 - 10 + 15)
        assert "decode" in by_mean["saturated"]


def test_a_result_takes_the_section_only_in_its_format() -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
    (path,) = fixture.glob("concurrency_1_*.json")
    data = json.loads(path.read_text())
    section = judge(LOW, ROLES_LOW, 10.0, 12.0, QUIET_CLIENT, None, e2el_ms=None).model_dump(mode="json")
    assert BenchResult.model_validate(data | {"bottleneck": section}).bottleneck is not None
    with pytest.raises(ValidationError, match=r"bottleneck\.verdict"):
        BenchResult.model_validate(data | {"bottleneck": section | {"verdict": "gpu-bound"}})
