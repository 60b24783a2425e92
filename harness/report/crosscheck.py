"""pdbench against `vllm bench serve` on the same servers, point by point: TPOT and output
throughput must agree within the noise allowance (both clients time the same server tokens);
TTFT is shown, not judged, because a client that is CPU-bound reads its first token late and
counts its own delay as TTFT. Each client's CPU share says which one was: pdbench's from its
result's `client` section, vLLM's from its run record (its process tree's CPU seconds per second
over its measured window, past its start-up). On a machine whose cores the servers use, a busy
client also takes CPU from the servers, and then its TPOT and throughput differ for real."""

from __future__ import annotations

import math

from harness.report.client_points import ClientPoint, vllm_points
from harness.report.model import SectionTable
from harness.report.points import Note, Point, Run, serving

# Two measurements of the same servers agree when they differ by at most NOISE, or by at most
# SPREAD standard errors of the difference, from the points' own per-request spread: few requests
# on a busy machine vary more than 10 % from one batch to the next.
NOISE = 0.10
SPREAD = 3.0
CPU_BOUND = 0.9  # a client process busy this share of one core is the likely limit of its timing


def _diff(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or not math.isfinite(ours) or not math.isfinite(theirs) or ours <= 0:
        return None
    return (theirs - ours) / ours


def _rse(p: Point, metric: str) -> float | None:
    """The relative standard error of a point's mean `metric` (ms) from its per-request spread."""
    mean, std, n = p.ms.get(f"mean_{metric}_ms"), p.ms.get(f"std_{metric}_ms"), p.completed
    if mean is None or std is None or not n or mean <= 0 or not math.isfinite(std):
        return None
    return std / math.sqrt(n) / mean


def allowance(p: Point, v: Point, metric: str) -> float:
    """The relative difference the two points' means may show: NOISE, or SPREAD standard errors."""
    a, b = _rse(p, metric), _rse(v, metric)
    if a is None or b is None:
        return NOISE
    return max(NOISE, SPREAD * math.hypot(a, b))


def _pct(d: float | None) -> str:
    return "–" if d is None else f"{d:+.0%}"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None or not math.isfinite(v) else format(v, fmt)


def pdbench_cpu(p: Point) -> float | None:
    """The busiest load process of pdbench's client over the point (its `client` section)."""
    busy = (p.client or {}).get("cpu_busy")
    if not isinstance(busy, list) or not busy or not all(isinstance(b, int | float) for b in busy):
        return None
    return float(max(busy))


def _share(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def crosscheck(runs: list[Run], notes: list[Note]) -> SectionTable | None:
    """The cross-check table with what it finds (disagreements beyond noise, CPU-bound clients)."""
    rows: list[tuple[str, ...]] = []
    findings: list[str] = []
    for run in runs:
        ours = {(serving(p), p.concurrency): p for p in run.points if p.source == "pdbench"}
        for cp in vllm_points(run, notes):
            row, found = _row(cp, ours.get((cp.serving, cp.concurrency)))
            rows.append(row)
            findings += found
    if not rows:
        return None
    return SectionTable(
        "Cross-check: pdbench vs vllm bench serve (same servers)",
        (
            "Run",
            "Serving",
            "Conc",
            "TPOT mean pdbench",
            "TPOT mean vllm",
            "TPOT diff",
            "Output tok/s pdbench",
            "Output tok/s vllm",
            "Tput diff",
            "TTFT p50 pdbench",
            "TTFT p50 vllm",
            "Client CPU pdbench",
            "Client CPU vllm",
            "Agree",
        ),
        tuple(rows),
        f"Both clients measured the same servers at the same concurrency, one after the other. TPOT and "
        f"output throughput agree when they differ by at most {NOISE:.0%} or by at most {SPREAD:g} standard "
        "errors of the difference (from each point's per-request spread of TPOT and of request latency); "
        "TTFT is shown, not judged: a "
        f"client whose process is busy {CPU_BOUND:.0%} of a core or more (Client CPU, over its measured "
        "window) reads first tokens late and counts that as TTFT. Times in ms.",
        tuple(findings),
    )


def _row(cp: ClientPoint, p: Point | None) -> tuple[tuple[str, ...], list[str]]:
    where = f"{cp.run} {cp.serving} C={cp.concurrency}"
    v = cp.point
    mine_cpu = pdbench_cpu(p) if p is not None else None
    if v is None or p is None:
        why = "vllm bench serve wrote no readable result" if v is None else "pdbench has no point there"
        if v is None and cp.returncode not in (None, 0):
            why += f" (it exited with code {cp.returncode})"
        cells = ("–",) * 8
        return (cp.run, cp.serving, str(cp.concurrency), *cells, _share(mine_cpu), _share(cp.cpu_share), "n/a"), [
            f"{where}: not compared, {why}"
        ]
    tpot_d = _diff(p.ms.get("mean_tpot_ms"), v.ms.get("mean_tpot_ms"))
    tput_d = _diff(p.output_throughput, v.output_throughput)
    # A closed loop's throughput is its concurrency's tokens over the mean request latency: its
    # noise is that mean's.
    checks = (("TPOT mean", tpot_d, allowance(p, v, "tpot")), ("output throughput", tput_d, allowance(p, v, "e2el")))
    off = [
        f"{what} differs by {_pct(d)} (allowed: {limit:.0%})"
        for what, d, limit in checks
        if d is not None and abs(d) > limit
    ]
    agree = "no" if off else ("yes" if tpot_d is not None and tput_d is not None else "n/a")
    found = [f"{where}: {', '.join(off)}, beyond noise"] if off else []
    ttft_d = _diff(p.ms.get("median_ttft_ms"), v.ms.get("median_ttft_ms"))
    bound = [
        name
        for name, share in (("vLLM's", cp.cpu_share), ("pdbench's", mine_cpu))
        if share is not None and share >= CPU_BOUND
    ]
    if ttft_d is not None and abs(ttft_d) > allowance(p, v, "ttft"):
        if bound:
            found.append(
                f"{where}: TTFT p50 differs by {_pct(ttft_d)}; {' and '.join(bound)} client was CPU-bound "
                f"(vLLM's client {_share(cp.cpu_share)} of a core, pdbench's {_share(mine_cpu)} by its client "
                "section), so its TTFT includes its own delay in reading the first token"
            )
        else:
            found.append(
                f"{where}: TTFT p50 differs by {_pct(ttft_d)} with neither client CPU-bound (vLLM's "
                f"{_share(cp.cpu_share)}, pdbench's {_share(mine_cpu)}): the clients' request timing differs"
            )
    row = (
        cp.run,
        cp.serving,
        str(cp.concurrency),
        _num(p.ms.get("mean_tpot_ms"), ".2f"),
        _num(v.ms.get("mean_tpot_ms"), ".2f"),
        _pct(tpot_d),
        _num(p.output_throughput),
        _num(v.output_throughput),
        _pct(tput_d),
        _num(p.ms.get("median_ttft_ms")),
        _num(v.ms.get("median_ttft_ms")),
        _share(mine_cpu),
        _share(cp.cpu_share),
        agree,
    )
    return row, found
