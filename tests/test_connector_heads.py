"""connector/heads.py: which prefill ranks a decode rank pulls which KV heads from."""

from __future__ import annotations

import itertools

import pytest

from connector.heads import head_span, plan


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
