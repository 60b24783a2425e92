"""Transfer observability: vLLM connector stats (log line) and Prometheus metrics.

Per transfer: bytes, seconds and throughput, separately for pulls (decode) and
sends (prefill); counters for failures, lease expiries and early releases, and of
the path (CUDA IPC or TCP) each completed transfer took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.v1.metrics.utils import create_metric_per_engine

_LISTS = ("recv_bytes", "recv_s", "recv_wait_s", "send_bytes", "send_s")
_COUNTS = ("failed_recv", "failed_send", "expired", "released", "recv_ipc", "recv_tcp", "send_ipc", "send_tcp")


@dataclass
class PdbenchStats(KVConnectorStats):
    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {**{k: [] for k in _LISTS}, **{k: 0 for k in _COUNTS}}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k in _LISTS:
            self.data[k].extend(other.data.get(k, []))
        for k in _COUNTS:
            self.data[k] += other.data.get(k, 0)
        return self

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in _LISTS + _COUNTS)

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for side in ("recv", "send"):
            nbytes, secs = self.data[f"{side}_bytes"], self.data[f"{side}_s"]
            if nbytes:
                t = sum(secs)
                out[f"Num {side}"] = len(nbytes)
                out[f"Avg {side} MB"] = round(sum(nbytes) / len(nbytes) / 2**20, 3)
                out[f"Avg {side} ms"] = round(t / len(secs) * 1e3, 3)
                out[f"{side.capitalize()} throughput (MB/s)"] = round(sum(nbytes) / 2**20 / t, 1) if t > 0 else 0
        for k in _COUNTS:
            out[k] = self.data[k]
        return out


class PdbenchPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        time_b = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
        bytes_b = [float(2 ** (10 + 2 * i)) for i in range(12)]  # 1 KiB .. 4 GiB
        rate_b = [1e6 * 10 ** (i / 2) for i in range(12)]  # 1 MB/s .. ~300 GB/s

        def hist(name: str, doc: str, buckets: list[float]) -> dict[int, Any]:
            m = self._histogram_cls(name=name, documentation=doc, buckets=buckets, labelnames=labelnames)  # type: ignore[call-arg]  # vLLM types it as any metric class
            return create_metric_per_engine(m, per_engine_labelvalues)

        def counter(name: str, doc: str) -> dict[int, Any]:
            m = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
            return create_metric_per_engine(m, per_engine_labelvalues)

        self.h: dict[str, dict[int, Any]] = {}
        self.c: dict[str, dict[int, Any]] = {}
        for side, what in (("recv", "pulled by this decode instance"), ("send", "sent by this prefill instance")):
            self.h[f"{side}_s"] = hist(
                f"vllm:pdbench_kv_{side}_seconds",
                f"Duration of KV transfers {what} (recv: pull request to ack).",
                time_b,
            )
            self.h[f"{side}_bytes"] = hist(f"vllm:pdbench_kv_{side}_bytes", f"Bytes per KV transfer {what}.", bytes_b)
            self.h[f"{side}_rate"] = hist(
                f"vllm:pdbench_kv_{side}_throughput_bytes_per_second", f"Throughput of KV transfers {what}.", rate_b
            )
            # Exported with the _total suffix.
            self.c[f"{side}_total"] = counter(f"vllm:pdbench_kv_{side}_transferred_bytes", f"Total KV bytes {what}.")
        self.h["recv_wait_s"] = hist(
            "vllm:pdbench_kv_recv_wait_seconds",
            "Time from a pull request to prefill's first byte (connect, lookup).",
            time_b,
        )
        for k, doc in (
            ("failed_recv", "KV pulls that failed (reported as load errors)."),
            ("failed_send", "KV sends that failed (blocks kept until the lease ends)."),
            ("expired", "Requests whose KV lease expired before decode pulled it."),
            ("released", "Requests released by decode without a pull (cached there)."),
            ("recv_ipc", "KV pulls done GPU to GPU through CUDA IPC (same host)."),
            ("recv_tcp", "KV pulls whose bytes crossed TCP."),
            ("send_ipc", "KV sends read by decode through CUDA IPC (same host)."),
            ("send_tcp", "KV sends whose bytes crossed TCP."),
        ):
            self.c[k] = counter(f"vllm:pdbench_kv_{k}", doc)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        d = transfer_stats_data
        for side in ("recv", "send"):
            for nbytes, secs in zip(d.get(f"{side}_bytes", []), d.get(f"{side}_s", []), strict=False):
                self.h[f"{side}_bytes"][engine_idx].observe(nbytes)
                self.h[f"{side}_s"][engine_idx].observe(secs)
                if secs > 0:
                    self.h[f"{side}_rate"][engine_idx].observe(nbytes / secs)
                self.c[f"{side}_total"][engine_idx].inc(nbytes)
        for w in d.get("recv_wait_s", []):
            self.h["recv_wait_s"][engine_idx].observe(w)
        for k in _COUNTS:
            if d.get(k):
                self.c[k][engine_idx].inc(d[k])
