"""What deployment a point measured, as a label: the truth table compares like with like, so two
disaggregated configurations on the same GPUs (1P3D and 2P2D, or 1P1D over two connectors) or two
baselines (two replicas, one instance over both GPUs) are never taken for repeats of each other.
From the result's metadata (harness.render.job writes it); what a file lacks is left out."""

from __future__ import annotations

from typing import Any

from harness.report.points import Point, serving


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def deployment(p: Point) -> str:
    """'1P1D nixl' (else '1+1 GPUs (P+D)'), '2 replicas', '1 instance (TP2)'; 'aggregated' when
    an aggregated point's file says no more."""
    md = p.metadata
    if serving(p) == "disagg":
        pw, dw = _int(md.get("prefill_num_workers")), _int(md.get("decode_num_workers"))
        name = f"{pw}P{dw}D" if pw and dw else f"{p.prefill_gpus}+{p.decode_gpus} GPUs (P+D)"
        connector = md.get("connector")
        return f"{name} {connector}" if isinstance(connector, str) and connector else name
    n, tp = _int(md.get("num_workers")), _int(md.get("tp"))
    if n is None:
        return "aggregated"
    name = f"{n} replicas" if n > 1 else "1 instance"
    return name + (f" (TP{tp})" if tp and tp > 1 else "")
