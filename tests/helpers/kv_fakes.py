"""KV hand-off doubles: a decode server's NIXL histograms as vLLM exposes them, connector timing
lines, and measured KV ceilings with the thresholds the transport tests judge by.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from harness.config.benchmark import ValidityThresholds
from harness.rundir.kv_ceiling import KvCeiling
from helpers.metrics_server import serve_metrics

GIB = 1 << 30

# vLLM 0.32 nixl/stats.py's buckets (0.20's are the same).
XFER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]

POST_BUCKETS = [0.001, *XFER_BUCKETS]

BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]

DESC_BUCKETS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000]


class NixlDecode:
    """A decode server's NIXL histograms, exposed as vLLM exposes them (one engine)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]

        def hist(name: str, buckets: list) -> Histogram:
            return Histogram(name, name, labels, buckets=buckets, registry=self.registry).labels("tiny", "0")

        self.xfer = hist("vllm:nixl_xfer_time_seconds", XFER_BUCKETS)
        self.post = hist("vllm:nixl_post_time_seconds", POST_BUCKETS)
        self.size = hist("vllm:nixl_bytes_transferred", BYTES_BUCKETS)
        self.desc = hist("vllm:nixl_num_descriptors", DESC_BUCKETS)

    def transfer(self, seconds: float, nbytes: int, descriptors: int, post_s: float) -> None:
        self.xfer.observe(seconds)
        self.size.observe(nbytes)
        self.desc.observe(descriptors)
        self.post.observe(post_s)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def line(pull: float, wait: float, nbytes: int, path: str = "ipc", ok: bool = True) -> dict:
    return {"id": "x", "pull_ms": pull, "pull_wait_ms": wait, "bytes": nbytes, "path": path, "ok": ok}


class NixlMetrics:
    """A decode server's /metrics whose NIXL histograms record one 64 MiB transfer in 20 ms of 8
    descriptors at every scrape: the point's scrapes differ by the transfers between them."""

    def __init__(self) -> None:
        self.decode = NixlDecode()
        self.scrapes = 0
        self.server = serve_metrics(self._render)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _render(self) -> str:
        self.scrapes += 1
        self.decode.transfer(0.02, 64 << 20, 8, 0.001)
        return self.decode.text()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# The share's edges on transfers of 1 GiB and more, with no fixed cost allowed (the plain rate).
T = ValidityThresholds(kv_min_ceiling_share=0.05, kv_judged_min_bytes=GIB, kv_fixed_cost_ms=0)


def ceiling(gbps: float, best: float | None = None) -> KvCeiling:
    """A measured ceiling whose median copy ran at `gbps` (and its fastest at `best`)."""
    rates = [gbps * 0.9, gbps, best or gbps]
    return KvCeiling(
        status="measured",
        method="cuda_peer_copy",
        src_device="cuda:1 H200",
        dst_device="cuda:0 H200",
        bytes=GIB,
        repeats=3,
        seconds=[GIB / (r * 1e9) for r in rates],
    )
