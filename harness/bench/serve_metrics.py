"""Aggregate metrics with `vllm bench serve` semantics and key names
(vllm/benchmarks/serve.py: calculate_metrics and the result dict).

Same as vLLM: TTFT/TPOT/ITL/E2EL over successful requests; TPOT =
(latency - ttft) / (output_tokens - 1) for requests of more than one token; mean,
median, population std and np.percentile (linear) per metric, 0 when there is no
sample; throughputs = totals / duration; request_goodput = requests meeting every
SLO / duration, where a one-token request's TPOT counts as 0 (null without SLOs);
max_output_tokens_per_s = most content events in one 1-second bucket counted from the
first send.

Differences from vLLM, on purpose:
- `duration` is first request send to last request end among the measured
  requests (vLLM: wall time of the whole run including client-side waits);
- `max_concurrent_requests` is the exact peak of overlapping [send, last token)
  intervals; vLLM counts every request active at any time within each 1-second
  bucket, which overstates it (1930 "concurrent" requests at --max-concurrency 256
  against a fast server);
- `failed` counts only the requests that were sent and did not succeed; those a stop (Ctrl-C,
  a time limit, an early invalid verdict, a dead target) kept from being sent are `not_sent`,
  neither completed nor failed (vLLM's run never stops early, so it has no such requests);
- `errors` lists only the failed requests' messages (vLLM: one entry per request,
  empty for successes);
- the output token count always comes from the server's usage (or the chunk
  count); vLLM falls back to re-tokenizing the generated text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.bench.client import RequestOutput

MS = 1000.0


def percentile_label(p: float) -> str:
    """vLLM's label: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def summarize(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean/median/std (population, as np.std) and percentiles in ms; 0 when empty, as vLLM."""
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=float) * MS
    out = {
        f"mean_{name}_ms": float(np.mean(arr)),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(np.std(arr)),
    }
    for p in percentiles:
        out[f"p{percentile_label(p)}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def tpot(out: RequestOutput) -> float | None:
    """Time per output token after the first; undefined for a single token."""
    if out.output_tokens <= 1:
        return None
    return (out.latency - out.ttft) / (out.output_tokens - 1)


def _peak_output_tokens_per_s(ok: list[RequestOutput]) -> float:
    """Most content chunks in any 1-second bucket from the first send (vLLM's method)."""
    t0 = min(o.start_time for o in ok)  # type: ignore[type-var]
    times: list[float] = []
    for o in ok:
        t = o.start_time + o.ttft  # type: ignore[operator]
        times.append(t)
        for gap in o.itl:
            t += gap
            times.append(t)
    buckets = np.bincount((np.asarray(times) - t0).astype(int).clip(min=0))
    return float(buckets.max())


def _peak_concurrency(ok: list[RequestOutput]) -> int:
    """Exact peak of overlapping [start, start+latency) intervals (a sweep line; an end
    at the same instant as a start is counted first)."""
    events = sorted(
        [(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok]  # type: ignore[operator]
    )
    return int(max(np.cumsum([d for _, d in events]), default=0))


def good_requests(ok: Sequence[RequestOutput], slos_ms: Mapping[str, float]) -> int:
    """Successful requests within every SLO (ms): vLLM's goodput rule, `<=` passes."""
    good = 0
    for o in ok:
        values = {"ttft": o.ttft, "tpot": tpot(o) or 0.0, "e2el": o.latency}
        if all(slo / MS >= values[k] for k, slo in slos_ms.items()):
            good += 1
    return good


def compute_metrics(
    outputs: Sequence[RequestOutput],
    percentiles: Sequence[float],
    goodput: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    sent = [o for o in outputs if o.sent]
    ok = [o for o in sent if o.success]
    failed = [o for o in sent if not o.success]
    output_lens = [o.output_tokens if o.success else 0 for o in outputs]
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(output_lens)

    ended = [o for o in sent if o.start_time is not None and o.end_time is not None]
    t0: float = min((o.start_time for o in ended), default=0.0)  # type: ignore[type-var,assignment]  # sent: all have start_time
    duration = max(o.end_time for o in ended) - t0 if ended else 0.0  # type: ignore[type-var,operator]

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    result: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "not_sent": len(outputs) - len(sent),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(ok)),
        "request_goodput": per_s(good_requests(ok, goodput)) if goodput else None,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
        "max_output_tokens_per_s": _peak_output_tokens_per_s(ok) if ok else 0.0,
        "max_concurrent_requests": _peak_concurrency(ok) if ok else 0,
        "latencies": [o.latency if o.success else 0.0 for o in outputs],
        "queue_times": [o.queue_time for o in outputs],
        "start_times": [o.start_time - t0 if o.start_time is not None else None for o in outputs],
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [list(o.itl) for o in outputs],
        "errors": [o.error for o in failed],
    }
    tpots = [t for o in ok if (t := tpot(o)) is not None]
    result |= summarize("ttft", [o.ttft for o in ok], percentiles)
    result |= summarize("tpot", tpots, percentiles)
    result |= summarize("itl", [g for o in ok for g in o.itl], percentiles)
    result |= summarize("e2el", [o.latency for o in ok], percentiles)
    return result
