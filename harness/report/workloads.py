"""The workload sections of pdbench's results as tables: TTFT by turn of a multi-turn point
(`sessions`), a trace replay's timing against the trace (`schedule`) and what each role's prefix
cache found (`prefix_cache`). A table is built only when some point has its section."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from harness.report.model import SectionTable
from harness.report.points import Point, Run, serving
from harness.rundir.session_summary import Stats


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _count(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def _rate(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _points(runs: Iterable[Run], has: Callable[[Point], bool]) -> list[tuple[Run, Point]]:
    found = [(run, p) for run in runs for p in run.points if has(p)]
    return sorted(found, key=lambda rp: (rp[1].isl or -1, rp[1].osl or -1, rp[1].concurrency, serving(rp[1])))


def sessions_table(runs: list[Run]) -> SectionTable | None:
    rows = []
    for run, p in _points(runs, lambda p: p.sessions is not None):
        s = p.sessions
        assert s is not None
        for t in s.by_turn:
            ttft: Stats = t.ttft_ms
            rows.append(
                (
                    run.label,
                    serving(p),
                    str(p.concurrency),
                    str(t.turn),
                    f"{t.completed}/{t.requests}",
                    _count(t.prompt_tokens_mean),
                    _ms(ttft.p50),
                    _ms(ttft.p90),
                    _ms(ttft.p99),
                    _ms(t.tpot_ms.p50),
                )
            )
    if not rows:
        return None
    return SectionTable(
        "TTFT by turn (multi-turn sessions)",
        (
            "Run",
            "Serving",
            "Conc",
            "Turn",
            "Completed",
            "Prompt tokens",
            "TTFT p50",
            "TTFT p90",
            "TTFT p99",
            "TPOT p50",
        ),
        tuple(rows),
        "Turn k's prompt is the whole conversation so far plus new user text (Prompt tokens: its mean as the "
        "server counted it), so a later turn shares most of its prompt with the one before; a prefix cache "
        "that keeps it shows as a lower TTFT than the prompt's length alone would give. Times in ms.",
    )


def schedule_table(runs: list[Run]) -> SectionTable | None:
    rows = []
    for run, p in _points(runs, lambda p: p.schedule is not None):
        s = p.schedule
        assert s is not None
        late, own = s.lateness_ms, s.client_lateness_ms
        rows.append(
            (
                run.label,
                serving(p),
                str(p.concurrency),
                f"{s.sent}/{s.requests}",
                f"{s.speed:g}",
                _ms(late.p50 if late else None),
                _ms(late.p99 if late else None),
                _ms(own.p99 if own else None),
                _ms(own.max if own else None),
                f"{s.in_flight_max}/{s.cap}",
                str(s.cap_delayed),
            )
        )
    if not rows:
        return None
    return SectionTable(
        "Trace replay timing",
        (
            "Run",
            "Serving",
            "Conc",
            "Sent",
            "Speed",
            "Late p50",
            "Late p99",
            "Client late p99",
            "Client late max",
            "In flight max/cap",
            "Cap-delayed",
        ),
        tuple(rows),
        "Lateness: send time minus the trace's time (over Speed), in ms. A request that found every one of "
        "the concurrency's slots busy waited for one (Cap-delayed): that wait is the cap's; Client late "
        "counts only the requests a free slot waited for, the client's own timing error.",
    )


def prefix_cache_table(runs: list[Run]) -> SectionTable | None:
    rows = []
    for run, p in _points(runs, lambda p: p.prefix_cache is not None):
        pc = p.prefix_cache
        assert pc is not None
        on = {True: "on", False: "off", None: "?"}[pc.enabled]
        for role, c in pc.roles.items():
            rows.append(
                (
                    run.label,
                    serving(p),
                    str(p.concurrency),
                    role,
                    on,
                    _count(c.queries),
                    _count(c.hits),
                    _rate(c.hit_rate),
                    _rate(c.external_hit_rate),
                )
            )
    if not rows:
        return None
    return SectionTable(
        "Prefix cache",
        ("Run", "Serving", "Conc", "Role", "Caching", "Queried tokens", "Hit tokens", "Hit rate", "External"),
        tuple(rows),
        "Each role's servers summed over the point, from vLLM's /metrics (vllm:prefix_cache_queries/hits). "
        "External: the KV connector's share (on decode, the prompt loaded from prefill: every request's KV, "
        "not a cache effect).",
    )
