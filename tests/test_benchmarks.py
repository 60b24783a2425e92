"""The benchmarks' own logic: the peers' order per round, the spread they print, the raw-TCP
ceiling that bounds the connector, and the verdicts their exit codes follow."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_connector_transfer as transfer
from benchmarks.common import free_port, rotated, spread
from connector.config import PdbenchConfig

pytestmark = pytest.mark.timeout(120)


def test_rotated_puts_each_peer_first_in_turn() -> None:
    peers = ["vllm", "pdbench", "floor"]
    firsts = [rotated(peers, r)[0] for r in range(3)]
    assert sorted(firsts) == sorted(peers)
    assert all(sorted(rotated(peers, r)) == sorted(peers) for r in range(5))
    assert [rotated(["a", "b"], r) for r in range(2)] == [["a", "b"], ["b", "a"]]
    assert rotated([], 3) == []


def test_spread_names_median_min_max_and_count() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == "2.50 (min 1.00 .. max 10.00, n 4)"
    assert spread([0.5], ".1f", " ms") == "0.5 ms (min 0.5 .. max 0.5, n 1)"
    with pytest.raises(ValueError):
        spread([])


def test_raw_tcp_ceiling_tries_the_connectors_own_buffers_and_autotuning() -> None:
    """A ceiling must be configured at least as well as what it bounds: the connector's
    sock_buf_bytes and the kernel's autotuning, each with blocking and with non-blocking I/O
    (the connector's), are among the settings it runs."""
    assert 0 in transfer.RAW_BUFS and PdbenchConfig().sock_buf_bytes in transfer.RAW_BUFS
    size = 1 << 20
    ceiling = transfer.raw_tcp_ceiling(free_port(), [size], reps=3)[size]
    labels = list(ceiling.by_setting)
    mib = f"{PdbenchConfig().sock_buf_bytes / 2**20:g}"
    for style in ("blocking", "non-blocking"):  # the connector's I/O is non-blocking
        ours = [label.removesuffix(f", {style}") for label in labels if label.endswith(f", {style}")]
        assert "autotuning" in ours, labels
        assert any(mib in label.split(" MiB")[0].split(" = ") for label in ours), labels
    # The ceiling is the best setting's median, never a worse one.
    assert ceiling.setting in labels and ceiling.seconds == min(ceiling.by_setting.values())
    assert ceiling.q1 <= ceiling.seconds <= ceiling.q3


def test_each_pdbench_flow_is_judged_on_its_own() -> None:
    """The overlapped flow meeting the goal does not pass the two-phase flow, which carries it."""
    from benchmarks.bench_connector_vllm import GOAL, GOAL_FLOW, OVERLAP, verdicts

    over, under = GOAL + 0.1, GOAL - 0.1
    flows = verdicts({GOAL_FLOW: {"1024": [over] * 3}, OVERLAP: {"1024": [under] * 3}})
    assert flows == {GOAL_FLOW: False, OVERLAP: True}
    # Every ISL must meet it: one ISL over fails the flow.
    assert not verdicts({GOAL_FLOW: {"1024": [under] * 3, "2048": [over] * 3}})[GOAL_FLOW]
    # The median of the rounds decides: one round over of three passes, two fail.
    assert verdicts({GOAL_FLOW: {"1024": [under, over, under]}})[GOAL_FLOW]
    assert not verdicts({GOAL_FLOW: {"1024": [over, under, over]}})[GOAL_FLOW]


def test_rounds_combine_into_pooled_medians_and_means() -> None:
    from benchmarks.bench_connector_vllm import combine

    r1 = {"ttfts_ms": [10.0, 11.0, 12.0], "ttft_ms_median": 11.0, "ttft_ms_mean": 11.0, "tokens": 192}
    r2 = {"ttfts_ms": [20.0, 21.0, 40.0], "ttft_ms_median": 21.0, "ttft_ms_mean": 27.0, "tokens": 192}
    r1["spans_ms"] = {"main": {"queue": 1.0}}
    r2["spans_ms"] = {"main": {"queue": 3.0}}
    v = combine([r1, r2])
    assert v["ttfts_ms"] == [10.0, 11.0, 12.0, 20.0, 21.0, 40.0]
    assert v["ttft_ms_median"] == 16.0 and v["ttft_ms_round_medians"] == [11.0, 21.0]
    assert v["ttft_ms_mean"] == 19.0 and v["spans_ms"]["main"]["queue"] == 2.0
    assert v["tokens"] == 384  # counts add up over rounds


def test_fidelity_matches_each_request_with_the_engines_record_of_it() -> None:
    """The client's own error is taken request by request: its times against the engine's
    record of the same request, found by index in the id (pdbench: the last batch to arrive)."""
    from benchmarks.bench_client_fidelity import by_index, error_stats, request_errors

    def rec(rid: str, arrival: float, first_ms: float, last_ms: float, tokens: int = 3) -> dict:
        return {"id": rid, "arrival_s": arrival, "first_ms": first_ms, "last_ms": last_ms, "tokens": tokens}

    warm = [rec("w-0", 1.0, 50, 90), rec("w-1", 1.0, 50, 90)]  # pdbench's warm-ups: an earlier batch
    main = [rec("m-1", 2.1, 70, 110), rec("m-0", 2.0, 50, 90)]  # engine order is not the client's
    engine = by_index(warm + main + [rec("other", 0.5, 1, 2)], None)
    assert {i: r["id"] for i, r in engine.items()} == {0: "m-0", 1: "m-1"}
    assert by_index([rec("fid0-7", 1.0, 1, 2), rec("fid1-7", 1.0, 1, 2)], "fid1-")[7]["id"] == "fid1-7"

    # Request 1 waited 20 ms longer in the engine: not the client's error. The client saw
    # request 0's first token 1 ms after it left and its last 3 ms after (1 ms per gap).
    client = {"ttfts": [0.051, 0.0705], "latencies": [0.093, 0.110], "output_lens": [3, 3]}
    errs = request_errors(client, engine)
    assert errs["ttft"] == pytest.approx([1.0, 0.5]) and errs["tpot"] == pytest.approx([1.0, -0.25])
    # Percentiles of a distribution of percentiles' differences would have mixed the requests.
    assert error_stats(errs["ttft"])["median"] == pytest.approx(0.75)
    with pytest.raises(SystemExit, match="recorded 1 of the 2"):
        request_errors(client, {0: engine[0]})
    with pytest.raises(SystemExit, match="other tokens"):
        request_errors({**client, "output_lens": [3, 4]}, engine)
    # A failed request (no tokens) has no times to compare.
    assert len(request_errors({**client, "output_lens": [3, 0]}, engine)["ttft"]) == 1


def test_fidelity_ab_guard_pairs_rounds_and_judges_the_median_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """The A/B guard divides each round's errors by the same round's reference (run back to back)
    and passes when the median over rounds of each ratio is within the tolerance."""
    import argparse

    from benchmarks.bench_client_fidelity import ab_verdict, concurrencies, span

    def side(*scales: float) -> list[dict]:  # one round per scale: 100 errors of 1..100 ms, scaled
        return [{"errors": {"ttft": [scale * k for k in range(1, 101)]}} for scale in scales]

    args = argparse.Namespace(ab_tolerance=1.35)
    # Rounds 1.0, 1.2, 3.0 times the reference: median ratio 1.2 passes; one slow round does not fail it.
    runs = {256: {"new": side(1.0, 1.2, 3.0), "ref": side(1.0, 1.0, 1.0)}}
    assert ab_verdict(args, runs, "new", "ref") is True
    assert "ratio 1.200 (min 1.000 .. max 3.000, n 3): PASS" in capsys.readouterr().out
    # Rounds are paired, not pooled: a reference that was slow in the same round excuses the new side.
    runs = {256: {"new": side(2.0, 2.0, 2.0), "ref": side(1.0, 1.0, 2.0)}}
    assert ab_verdict(args, runs, "new", "ref") is False
    assert "ratio 2.000 (min 1.000 .. max 2.000, n 3): FAIL" in capsys.readouterr().out
    assert concurrencies("64,256") == [64, 256]
    for bad in ("", "0", "64,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
            concurrencies(bad)
    records = {0: {"arrival_s": 10.0, "last_ms": 500.0}, 1: {"arrival_s": 10.2, "last_ms": 900.0}}
    assert span(records) == pytest.approx((10.0, 11.1))  # first arrival .. last request's last write


def test_fidelity_ab_guard_asks_each_tree_for_its_flag_names() -> None:
    """A tree's `pdbench bench` is driven with the directory flags its CLI has (renamed since)."""
    from benchmarks.bench_client_fidelity import ROOT, pdbench_client

    cmd = pdbench_client("this", ROOT).command("http://127.0.0.1:1", "tok", 8, 2, Path("out"), "p-", _FidelityArgs())
    assert "--results-dir" in cmd and "--timings-dir" in cmd
    assert "--result-dir" not in cmd and "--proxy-timings-dir" not in cmd


class _FidelityArgs:
    osl, range_ratio, workers = 64, 0.25, 1


def test_sentinel_overhead_counts_judges_and_reads_the_reference_pass() -> None:
    """The script expects the recipe's sentinels per point, judges the median of the rounds'
    ratios, and reads pdbench bench's own report of the reference pass."""
    from benchmarks.bench_sentinel_overhead import GOAL, recipe, reference_pass, sentinels_per_point, verdict

    # 2 % of 10 x C measured requests, at least 4: the defaults the benchmark's conditions state.
    assert sentinels_per_point(recipe([8, 32, 64], 1024, 128)) == {8: 4, 32: 6, 64: 13}
    over, under = GOAL + 0.01, GOAL - 0.01
    assert verdict([under, over, under]) and not verdict([over, under, over])
    assert verdict([GOAL]) and not verdict([over])
    log = (
        "[pdbench bench] sentinels: 23 of 23 reference answers from prefill-0: whole requests to "
        "http://127.0.0.1:1/v1/completions before the sweep in 1.4 s\n[pdbench bench] C=8: 16 warmups, then 80"
    )
    assert reference_pass(log) == (23, 23, 1.4)
    assert reference_pass("[pdbench bench] C=8: 16 warmups, then 80 requests at rate inf") is None
