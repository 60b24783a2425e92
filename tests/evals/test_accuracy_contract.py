"""The eval artifacts against what InferenceX's utils/collect_eval_results.py reads.

CI cannot reach InferenceX, so the reads are written down here as the contract, from
SemiAnalysisAI/InferenceX at commit 843c6254ff69b567f772f6a5fd97675af3d04431
(utils/collect_eval_results.py: find_eval_sets, detect_lm_eval_jsons, extract_lm_metrics,
build_row; benchmarks/benchmark_lib.sh: _write_lm_eval_meta_json). The real script was run by
hand against a real job's artifacts (docs/accuracy.md says how). tests/e2e/test_accuracy_e2e.py
checks a real lm-eval run's files with `collect_rows`.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.accuracy_rows import collect_rows

from harness.evals.lm_eval_run import META_ENV, _move_up
from harness.evals.meta_env import EvalJob, Role, meta_env


def _lm_eval_output(raw: Path) -> None:
    """lm-eval's --output_path as 0.4.13 leaves it: <output>/<model>/results_<t>.json and samples."""
    (raw / "copy").mkdir(parents=True)
    results = {
        "results": {"pdbench_copy": {"exact_match,strict-match": 1.0, "exact_match_stderr,strict-match": 0.0}},
        "configs": {
            "pdbench_copy": {
                "metric_list": [{"metric": "exact_match"}],
                "filter_list": [{"name": "strict-match", "filter": [{"function": "take_first"}]}],
            }
        },
        "n-samples": {"pdbench_copy": {"original": 24, "effective": 16}},
        "model_name": "copy",
        "lm_eval_version": "0.4.13",
    }
    (raw / "copy" / "results_2026-01-01T00-00-00.json").write_text(json.dumps(results))
    (raw / "copy" / "samples_pdbench_copy_2026-01-01T00-00-00.jsonl").write_text("{}\n")


def test_artifacts_are_what_the_collector_reads(tmp_path: Path) -> None:
    eval_dir = tmp_path / "evals" / "disagg-after"
    task_dir = eval_dir / "pdbench_copy"
    _lm_eval_output(task_dir / "lm-eval-output")
    _move_up(task_dir / "lm-eval-output", task_dir)
    job = EvalJob(
        "disagg",
        "after",
        4,
        "copy",
        "pdbench-copy",
        "fp32",
        "cpu",
        256,
        32,
        "f",
        Role(1, 1, False, 1),
        Role(1, 1, False, 2),
    )
    (task_dir / META_ENV).write_text(json.dumps(meta_env(job)))
    # lm-eval's files sit flat beside meta_env.json, as InferenceX's append_lm_eval_summary leaves them.
    assert sorted(p.name for p in task_dir.iterdir()) == [
        "meta_env.json",
        "results_2026-01-01T00-00-00.json",
        "samples_pdbench_copy_2026-01-01T00-00-00.jsonl",
    ]
    assert collect_rows(eval_dir) == [
        {"task": "pdbench_copy", "is_multinode": True, "conc": 4, "score": 1.0, "n_eff": 16, "model": "copy"}
    ]
