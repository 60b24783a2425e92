"""What InferenceX's agentic aggregation reads of an aiperf run (process_agentic_result.py, read at 843c6254),
and stand-ins for the external clients."""

from __future__ import annotations

from pathlib import Path

# What process_agentic_result.py reads, relative to the RESULT_DIR it is given (see above).
AGENTIC_READS = ("aiperf_artifacts/profile_export.jsonl", "aiperf_artifacts/profile_export_aiperf.json")

AGENTIC_RECORD_METRICS = ("time_to_first_token", "request_latency", "inter_token_latency", "output_sequence_length")


# Stand-ins for aiperf and `vllm bench serve` that send nothing: each writes, from its own command
# line, the files the real client leaves in its point directory (aiperf's artifacts; vLLM's
# --save-result with the keys the report's cross-check reads).
_FAKE_AIPERF = """
import json, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--output-artifact-dir") + 1])
out.mkdir(parents=True)
record = {"metadata": {"benchmark_phase": "profiling", "request_end_ns": 1}, "metrics": {}}
(out / "profile_export.jsonl").write_text(json.dumps(record) + "\\n")
(out / "profile_export_aiperf.json").write_text(json.dumps({"metadata": {"dataset": "fake"}}))
print("fake aiperf: wrote", out)
"""
_FAKE_VLLM = """
import json, sys
from pathlib import Path
arg = lambda flag: sys.argv[sys.argv.index(flag) + 1]
n, c = int(arg("--num-prompts")), int(arg("--max-concurrency"))
result = {
    "backend": arg("--backend"), "max_concurrency": c, "num_prompts": n, "completed": n, "failed": 0,
    "output_throughput": 100.0, "total_token_throughput": 900.0, "mean_tpot_ms": 10.0, "median_tpot_ms": 10.0,
    "std_tpot_ms": 0.5, "mean_ttft_ms": 50.0, "median_ttft_ms": 50.0, "std_ttft_ms": 2.0, "p99_ttft_ms": 90.0,
    "mean_e2el_ms": 360.0, "median_e2el_ms": 360.0, "std_e2el_ms": 10.0,
    "random_input_len": int(arg("--random-input-len")), "random_output_len": int(arg("--random-output-len")),
}
Path(arg("--result-dir"), arg("--result-filename")).write_text(json.dumps(result))
print("fake vllm bench serve: wrote", arg("--result-filename"))
"""


def write_fake_clients(bin_dir: Path, python: str) -> tuple[Path, Path]:
    """Executable fakes of aiperf and `vllm` in bin_dir, run by `python`: (aiperf, vllm)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name, body in (("aiperf", _FAKE_AIPERF), ("vllm", _FAKE_VLLM)):
        path = bin_dir / name
        path.write_text(f"#!{python}\n{body.lstrip()}")
        path.chmod(0o755)
        out.append(path)
    return out[0], out[1]
