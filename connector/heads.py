"""Which prefill TP ranks hold the KV heads a decode TP rank needs, when the TP sizes differ.

vLLM splits a layer's KV heads evenly over TP ranks; with more ranks than heads it
replicates them (rank r holds head r * heads // tp). So with prefill TP 2 and decode
TP 1, decode's one rank pulls half its heads from each prefill rank; with prefill TP 1
and decode TP 2, each decode rank pulls its half of prefill's one rank. Every prefill
rank must hear from decode, by a pull or a release, because vLLM frees a request's
blocks only when every prefill rank reported it sent: a prefill rank whose heads no
decode rank reads (replicated heads) is released instead. MLA caches have one latent
"head" replicated on every rank, so one pull per decode rank covers it.
"""

from __future__ import annotations

from dataclasses import dataclass


def head_span(rank: int, tp: int, total: int) -> tuple[int, int]:
    """Global KV heads [start, stop) held by `rank` of `tp` ranks, for `total` heads."""
    if tp < 1 or not 0 <= rank < tp or total < 1:
        raise ValueError(f"bad TP layout: rank {rank} of {tp}, {total} KV heads")
    if total % tp and tp % total:
        raise ValueError(f"{total} KV heads do not split over TP {tp}")
    start = rank * total // tp
    return start, start + max(1, total // tp)


@dataclass(frozen=True)
class Source:
    """One pull of a decode rank: heads [remote) of prefill rank `rank` into our heads [local)."""

    rank: int
    remote: tuple[int, int]  # in that prefill rank's own head indices
    local: tuple[int, int]  # in this decode rank's head indices
    readers: int  # how many decode ranks pull from that prefill rank (it frees after all acked)
    reader: int  # this decode rank's index among them
    whole: bool  # every head of both ranks (equal layouts): the pull names no head range


def _sources(rank: int, tp: int, remote_tp: int, total: int) -> list[tuple[int, int, int]]:
    """(prefill rank, global head start, stop) covering decode `rank`'s heads, in head order."""
    lo, hi = head_span(rank, tp, total)
    spans = [head_span(p, remote_tp, total) for p in range(remote_tp)]
    out: list[tuple[int, int, int]] = []
    h = lo
    while h < hi:
        holders = [p for p in range(remote_tp) if spans[p][0] <= h < spans[p][1]]
        # Replicated heads: spread the decode ranks that need one head over its holders.
        p = holders[rank % len(holders)]
        stop = min(hi, spans[p][1])
        out.append((p, h, stop))
        h = stop
    return out


def plan(rank: int, tp: int, remote_tp: int, total: int) -> tuple[list[Source], list[int]]:
    """The pulls of decode `rank`, and the prefill ranks it releases because no decode rank reads them."""
    by_rank = [_sources(d, tp, remote_tp, total) for d in range(tp)]
    readers: dict[int, list[int]] = {}
    for d, srcs in enumerate(by_rank):
        for p, _, _ in srcs:
            if d not in readers.setdefault(p, []):
                readers[p].append(d)
    lo, hi = head_span(rank, tp, total)
    pulls = []
    for p, a, b in by_rank[rank]:
        p_lo, p_hi = head_span(p, remote_tp, total)
        whole = (a, b) == (lo, hi) == (p_lo, p_hi)
        pulls.append(Source(p, (a - p_lo, b - p_lo), (a - lo, b - lo), len(readers[p]), readers[p].index(rank), whole))
    idle = [p for p in range(remote_tp) if p not in readers and p % tp == rank]
    return pulls, idle


def plan_for_cache(
    rank: int, tp: int, remote_tp: int, total: int, cache_heads: int | None
) -> tuple[list[Source], list[int]]:
    """`plan` for a decode rank whose cache holds `cache_heads` heads on its dim 1 (None: a cache
    without a head dimension); raises ValueError where that cache cannot take the prefill's layout."""
    if remote_tp == tp:
        return [Source(rank, (0, 0), (0, 0), 1, 0, True)], []
    if cache_heads is None:
        if total != 1:
            raise ValueError("this KV cache has no head dimension to split between TP sizes")
        # MLA: one latent "head", the same on every rank of either side: a decode rank reads one
        # prefill rank's whole blocks, and the prefill ranks no decode rank reads are released.
        return plan(rank, tp, remote_tp, 1)
    mine = head_span(rank, tp, total)
    if mine[1] - mine[0] != cache_heads:
        raise ValueError(f"this rank holds {cache_heads} KV heads, not the {mine[1] - mine[0]} expected")
    return plan(rank, tp, remote_tp, total)
