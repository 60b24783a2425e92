"""aiperf as the end-to-end tests use it: where it is installed, a small agentic trace for it, and
what InferenceX's agentic aggregation reads of its run (process_agentic_result.py, read at 843c6254)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

import harness

# What process_agentic_result.py reads, relative to the RESULT_DIR it is given (see above).
AGENTIC_READS = ("aiperf_artifacts/profile_export.jsonl", "aiperf_artifacts/profile_export_aiperf.json")

AGENTIC_RECORD_METRICS = ("time_to_first_token", "request_latency", "inter_token_latency", "output_sequence_length")

# Where scripts/setup.sh installs aiperf (its own venv), which a recipe's default executable names.
AIPERF = Path(harness.__file__).resolve().parents[1] / ".venv-aiperf" / "bin" / "aiperf"


def aiperf_missing() -> str | None:
    """Why aiperf cannot run here, or None when it is installed."""
    if AIPERF.is_file():
        return None
    return f"aiperf is not installed at {AIPERF} (scripts/setup.sh installs it unless PDBENCH_NO_AIPERF)"


def require_aiperf() -> None:
    """Skip without aiperf; CI (PDBENCH_REQUIRE_VLLM) fails instead, as for vLLM itself."""
    if (msg := aiperf_missing()) is not None:
        if os.environ.get("PDBENCH_REQUIRE_VLLM"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def write_weka_trace(folder: Path, traces: int = 3, turns: int = 5, block: int = 64) -> Path:
    """Agentic coding sessions in the Weka KV-cache-tester format (aiperf's weka_trace loader):
    each request's hash ids extend the previous request's, so every turn re-sends its session's
    context (the prefix sharing of a real trace), from 256 tokens up, 16 tokens out."""
    folder.mkdir(parents=True)
    for k in range(traces):
        requests: list[dict] = []
        ids: list[int] = []
        length = 256
        for i in range(turns):
            while len(ids) < math.ceil(length / block):
                ids.append(1000 * k + len(ids))
            requests.append(
                {"t": float(i), "type": "s", "model": "tiny", "in": length, "out": 16, "hash_ids": list(ids)}
                | {"stop": "tool_use", "api_time": 0.5, "think_time": 0.2}
            )
            length += 144
        trace = {"id": f"trace-{k}", "models": ["tiny"], "block_size": block, "hash_id_scope": "local"}
        (folder / f"trace-{k}.json").write_text(json.dumps(trace | {"requests": requests}))
    return folder


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
