"""InferenceX's eval collector as pdbench's accuracy tests read it: the rows that
collect_eval_results.py takes from an eval directory, and the meta_env.json types it expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.evals.lm_eval_run import META_ENV

# meta_env.json keys build_row reads, with the JSON types _write_lm_eval_meta_json gives them.
META_TYPES: dict[str, type | tuple[type, ...]] = {
    "is_multinode": bool,
    "infmax_model_prefix": str,
    "model": str,
    "hw": str,
    "framework": str,
    "precision": str,
    "spec_decoding": str,
    "isl": str,
    "osl": str,
    "tp": int,
    "ep": int,
    "conc": int,
    "dp_attention": bool,
    "prefill_tp": int,
    "prefill_ep": int,
    "prefill_dp_attention": bool,
    "prefill_num_workers": int,
    "decode_tp": int,
    "decode_ep": int,
    "decode_dp_attention": bool,
    "decode_num_workers": int,
}


def collect_rows(eval_dir: Path) -> list[dict[str, Any]]:
    """What collect_eval_results.py takes from an eval directory given as its results_dir:
    each immediate subdirectory with meta_env.json is one set; its latest *.json (not
    meta_env.json) carrying lm_eval_version is lm-eval's; per task, the metric of
    configs[task].metric_list[0] under the filter whose name has 'strict'."""
    rows = []
    for d in sorted(p for p in eval_dir.iterdir() if (p / META_ENV).exists()):
        meta = json.loads((d / META_ENV).read_text())
        for key, kind in META_TYPES.items():
            assert isinstance(meta[key], kind), (d, key, meta.get(key))
        assert "eval_concs" not in meta  # not a batched artifact: the latest results file counts
        lm = [p for p in d.glob("*.json") if p.name != META_ENV and "lm_eval_version" in json.loads(p.read_text())]
        assert lm, f"{d}: no lm-eval results file"
        data = json.loads(max(lm, key=lambda p: p.stat().st_mtime).read_text())
        for task, res in data["results"].items():
            cfg = data["configs"][task]
            metric = cfg["metric_list"][0]["metric"]
            strict = [f["name"] for f in cfg.get("filter_list", []) if "strict" in f["name"]]
            key = f"{metric},{strict[0]}" if strict else metric
            rows.append(
                {
                    "task": task,
                    "is_multinode": meta["is_multinode"],
                    "conc": meta["conc"],
                    "score": res.get(key),
                    "n_eff": data.get("n-samples", {}).get(task, {}).get("effective"),
                    "model": data.get("model_name") or meta["model"],
                }
            )
    return rows
