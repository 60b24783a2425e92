"""meta_env.json: the job's description beside lm-eval's results, as InferenceX writes it.

The keys and value types are those of `_write_lm_eval_meta_json` in InferenceX's
benchmarks/benchmark_lib.sh (SemiAnalysisAI/InferenceX at 843c6254ff69b567f772f6a5fd97675af3d04431),
read back by utils/collect_eval_results.py. Its disaggregated (multi-node) workflow sets
is_multinode true and the prefill_*/decode_* fields; tp, ep and dp_attention then are prefill's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Role:
    tp: int
    ep: int
    dp_attention: bool
    workers: int

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Role:
        """From a recipe's topology.<role> (recipe.lock.yaml)."""
        return cls(int(spec["tp"]), int(spec["ep"]), bool(spec["dp_attention"]), int(spec["workers"]))


@dataclass(frozen=True)
class EvalJob:
    """What meta_env.json says of the deployment an eval ran against."""

    phase: str  # disagg | aggregated
    when: str
    concurrency: int
    model: str  # the served model name (lm-eval's model=)
    model_prefix: str  # the catalogue key
    precision: str
    hw: str
    isl: int
    osl: int
    fingerprint: str
    prefill: Role
    decode: Role


def meta_env(job: EvalJob) -> dict[str, Any]:
    multinode = job.phase == "disagg"
    # The aggregated baseline is one role serving whole requests: InferenceX's single-node shape,
    # where prefill_* and decode_* repeat tp/ep.
    lead = job.prefill
    decode = job.decode if multinode else job.prefill
    return {
        "is_multinode": multinode,
        "framework": "vllm",
        "precision": job.precision,
        "spec_decoding": "",
        "recipe_fingerprint": job.fingerprint,
        "tp": lead.tp,
        "pp": 1,
        "dcp_size": 1,
        "pcp_size": 1,
        "conc": job.concurrency,
        "ep": lead.ep,
        "dp_attention": lead.dp_attention,
        "prefill_tp": lead.tp,
        "prefill_pp": 1,
        "prefill_dcp_size": 1,
        "prefill_pcp_size": 1,
        "prefill_ep": lead.ep,
        "prefill_dp_attention": lead.dp_attention,
        "prefill_num_workers": lead.workers,
        "decode_tp": decode.tp,
        "decode_pp": 1,
        "decode_dcp_size": 1,
        "decode_pcp_size": 1,
        "decode_ep": decode.ep,
        "decode_dp_attention": decode.dp_attention,
        "decode_num_workers": decode.workers,
        "model": job.model,
        "infmax_model_prefix": job.model_prefix,
        "hw": job.hw,
        # InferenceX writes these two as strings.
        "isl": str(job.isl),
        "osl": str(job.osl),
        # pdbench's own keys (the collector ignores keys it does not know).
        "pdbench_phase": job.phase,
        "pdbench_when": job.when,
    }
