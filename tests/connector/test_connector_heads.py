"""connector/heads.py: which prefill ranks a decode rank pulls which KV heads from."""

from __future__ import annotations

import itertools

import pytest

from connector.heads import head_span, plan, plan_for_cache


def test_head_span_splits_and_replicates_like_vllm() -> None:
    assert [head_span(r, 2, 8) for r in range(2)] == [(0, 4), (4, 8)]
    assert [head_span(r, 8, 2) for r in range(8)] == [(0, 1)] * 4 + [(1, 2)] * 4
    assert [head_span(r, 4, 1) for r in range(4)] == [(0, 1)] * 4  # MLA: one latent head
    with pytest.raises(ValueError, match="do not split"):
        head_span(0, 3, 8)


def test_equal_tp_pulls_whole_blocks_from_the_same_rank() -> None:
    for tp in (1, 2, 8):
        for r in range(tp):
            pulls, idle = plan(r, tp, tp, 8)
            assert [(s.rank, s.whole, s.readers) for s in pulls] == [(r, True, 1)] and not idle


@pytest.mark.parametrize("total", [1, 2, 4, 8])
def test_every_head_is_read_once_and_every_prefill_rank_hears_from_decode(total: int) -> None:
    sizes = [1, 2, 4, 8]
    for p_tp, d_tp in itertools.product(sizes, sizes):
        told: set[int] = set()
        reads: dict[int, list[int]] = {}
        for d in range(d_tp):
            pulls, idle = plan(d, d_tp, p_tp, total)
            lo, hi = head_span(d, d_tp, total)
            got: list[int] = []
            for s in pulls:
                p_lo = head_span(s.rank, p_tp, total)[0]
                assert s.remote[1] - s.remote[0] == s.local[1] - s.local[0]
                # The heads pulled are the ones this rank holds, at the right places.
                assert [p_lo + h for h in range(*s.remote)] == [lo + h for h in range(*s.local)]
                got += [lo + h for h in range(*s.local)]
                reads.setdefault(s.rank, []).append(s.reader)
                assert s.readers == len(
                    {x for x in range(d_tp) if s.rank in {y.rank for y in plan(x, d_tp, p_tp, total)[0]}}
                )
            assert got == list(range(lo, hi)), (p_tp, d_tp, d)
            told |= {s.rank for s in pulls} | set(idle)
            assert not set(idle) & {s.rank for s in pulls}
        assert told == set(range(p_tp)), (p_tp, d_tp, total)  # no rank waits for a lease
        for readers in reads.values():
            assert sorted(readers) == list(range(len(readers)))  # reader indices 0..n-1


@pytest.mark.parametrize(("p_tp", "d_tp"), [(2, 1), (1, 2), (4, 2), (2, 4), (8, 1)])
def test_an_mla_cache_reads_one_prefill_rank_whole_across_tp_sizes(p_tp: int, d_tp: int) -> None:
    # MLA's cache has no head dimension (blocks, block size, latent): the latent is the same on
    # every rank, so a decode rank pulls one prefill rank's blocks whole, whatever the TP sizes
    # (x4's TP2+EP2 prefill into a TP1 decode failed every request before: "no head dimension").
    told: set[int] = set()
    for d in range(d_tp):
        pulls, idle = plan_for_cache(d, d_tp, p_tp, 1, None)
        assert len(pulls) == 1 and pulls[0].whole, pulls
        told |= {pulls[0].rank, *idle}
    assert told == set(range(p_tp))  # every prefill rank frees its blocks: pulled or released


def test_a_cache_without_heads_cannot_split_real_heads() -> None:
    with pytest.raises(ValueError, match="no head dimension"):
        plan_for_cache(0, 1, 2, 8, None)
    with pytest.raises(ValueError, match="holds 2 KV heads, not the 4"):
        plan_for_cache(0, 2, 1, 8, 2)
    assert plan_for_cache(0, 2, 1, 8, 4)[0][0].rank == 0  # the heads it holds: pulled from rank 0
