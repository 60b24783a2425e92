"""The accuracy section, the eval's summary and verdict, and meta_env.json (no lm-eval run here:
tests/e2e/test_accuracy_e2e.py runs it for real against real vLLM)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.config import load_recipe
from harness.config.accuracy import LMEVAL_VENV, AccuracySpec, AccuracyTask, problems
from harness.config.checkout import CHECKOUT
from harness.config.schema import Recipe
from harness.evals.command import Endpoint, lm_eval_argv
from harness.evals.interpreter import lm_eval_python
from harness.evals.meta_env import EvalJob, Role, meta_env
from harness.evals.summary import failures, score_task, stderr_key, verdict, write
from harness.node.node_checks import checks_for
from harness.render.job import current_context, render_job
from harness.rundir.accuracy_summary import AccuracySummary
from harness.topology import PlanFile

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "evals" / "pdbench_copy"


def _recipe(**accuracy: object) -> dict:
    return {
        "model": "m",
        "topology": {"prefill": {"port": 8100}, "decode": {"port": 8200}},
        "connector": {"name": "nixl"},
        "benchmark": {"isl": 8, "osl": 8, "concurrency": [1, 16, 4]},
        "accuracy": accuracy,
    }


def test_defaults_are_off_gsm8k_after_the_sweep() -> None:
    a = Recipe.model_validate(_recipe()).accuracy
    assert not a.enabled and [t.name for t in a.tasks] == ["gsm8k"] and a.when == "after"
    assert a.model_type == "local-completions" and a.tasks[0].metric == "exact_match,strict-match"
    assert a.concurrency_for([1, 16, 4]) == 16  # the sweep's highest, as InferenceX
    assert a.evaluated(["disagg", "aggregated"]) == []


def test_off_is_left_out_of_the_lock_on_is_kept() -> None:
    assert "accuracy" not in Recipe.model_validate(_recipe()).model_dump(mode="json")
    dumped = Recipe.model_validate(_recipe(enabled=True)).model_dump(mode="json")
    assert dumped["accuracy"]["enabled"] is True and dumped["accuracy"]["tasks"][0]["name"] == "gsm8k"


@pytest.mark.parametrize(
    "accuracy,key",
    [
        ({"when": "during"}, "accuracy.when"),
        ({"tasks": [{"name": "gsm8k", "threshold": 1.5}]}, "accuracy.tasks.0.threshold"),
        ({"tasks": [{"name": "gsm8k", "metric": "exact match"}]}, "accuracy.tasks.0.metric"),
        ({"tasks": [{"name": "gsm8k", "limt": 3}]}, "accuracy.tasks.0.limt"),
        ({"tasks": []}, "accuracy.tasks"),
        ({"tasks": [{"name": "a"}, {"name": "a"}]}, "accuracy"),
        ({"model_type": "openai"}, "accuracy.model_type"),
        ({"phases": ["prefill"]}, "accuracy.phases.0"),
        ({"concurrency": 0}, "accuracy.concurrency"),
        ({"python": " "}, "accuracy.python"),
    ],
)
def test_bad_settings_name_their_key(accuracy: dict, key: str) -> None:
    with pytest.raises(ValidationError) as e:
        Recipe.model_validate(_recipe(**accuracy))
    locs = [".".join(str(p) for p in err["loc"]) for err in e.value.errors()]
    assert any(loc.startswith(key) for loc in locs), locs


def test_problems_name_a_missing_task_directory_and_an_absent_phase(tmp_path: Path) -> None:
    spec = AccuracySpec(enabled=True, phases=["aggregated"], tasks=[AccuracyTask(name="t", include_path="no/such/dir")])
    out = problems(spec, ["disagg"], tmp_path)
    assert out == [
        "accuracy.phases: aggregated is not a phase of this job (it runs disagg)",
        f"accuracy.tasks[0].include_path: {tmp_path / 'no/such/dir'} is not a directory",
    ]
    ok = AccuracySpec(enabled=True, tasks=[AccuracyTask(name="pdbench_copy", include_path=str(FIXTURE))])
    assert FIXTURE.is_dir() and problems(ok, ["disagg"], tmp_path) == []


def test_verdict() -> None:
    assert verdict(0.95, 0.9) is True and verdict(0.9, 0.9) is True
    assert verdict(0.89, 0.9) is False and verdict(None, 0.9) is False
    assert verdict(0.1, None) is None
    assert stderr_key("exact_match,strict-match") == "exact_match_stderr,strict-match"
    assert stderr_key("acc") == "acc_stderr"


# The keys lm-eval 0.4.13 writes (a results file of the fixture task, trimmed).
RESULTS = {
    "results": {
        "pdbench_copy": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1118, "alias": "x"}
    },
    "n-samples": {"pdbench_copy": {"original": 24, "effective": 16}},
    "lm_eval_version": "0.4.13",
}


def _summary(tasks: list, error: str | None = None) -> AccuracySummary:
    return AccuracySummary(
        phase="disagg",
        when="after",
        concurrency=4,
        lm_eval_version="0.4.13",
        base_url="http://127.0.0.1:30000/v1/completions",
        elapsed_s=12.346,
        tasks=tuple(tasks),
        error=error,
    )


def test_summary_format_and_failure_text(tmp_path: Path) -> None:
    task = AccuracyTask(name="pdbench_copy", threshold=0.9)
    s = _summary([score_task(task, RESULTS)])
    path = write(s, tmp_path / "pdbench-accuracy.json")
    assert json.loads(path.read_text()) == {
        "phase": "disagg",
        "when": "after",
        "concurrency": 4,
        "lm_eval_version": "0.4.13",
        "base_url": "http://127.0.0.1:30000/v1/completions",
        "elapsed_s": 12.346,
        "tasks": [
            {
                "task": "pdbench_copy",
                "metric": "exact_match,strict-match",
                "score": 0.25,
                "stderr": 0.1118,
                "threshold": 0.9,
                "passed": False,
                "samples": 16,
            }
        ],
        "passed": False,
        "error": None,
    }
    assert failures(s) == [
        "accuracy disagg after: task pdbench_copy scored 0.2500 (exact_match,strict-match), under its threshold 0.9"
    ]
    with pytest.raises(FileExistsError):  # never over an earlier eval's summary
        write(s, path)


def test_overall_verdict() -> None:
    judged = score_task(AccuracyTask(name="pdbench_copy", threshold=0.2), RESULTS)
    unjudged = score_task(AccuracyTask(name="pdbench_copy"), RESULTS)
    missing = score_task(AccuracyTask(name="other", threshold=0.2), RESULTS)
    assert judged.passed is True and unjudged.passed is None and missing.score is None and missing.passed is False
    assert _summary([judged, unjudged]).passed is True
    assert _summary([unjudged]).passed is None
    assert _summary([judged, missing]).passed is False
    assert _summary([judged], error="task x: lm-eval exited with code 1").passed is False
    na = score_task(
        AccuracyTask(name="t"),
        {"results": {"t": {"exact_match,strict-match": 1.0, "exact_match_stderr,strict-match": "N/A"}}},
    )
    assert na.score == 1.0 and na.stderr is None and na.samples is None


def _job(phase: str) -> EvalJob:
    return EvalJob(
        phase=phase,
        when="after",
        concurrency=64,
        model="copy",
        model_prefix="pdbench-copy",
        precision="fp32",
        hw="cpu",
        isl=1024,
        osl=128,
        fingerprint="abc",
        prefill=Role(tp=4, ep=4, dp_attention=False, workers=2),
        decode=Role(tp=8, ep=1, dp_attention=True, workers=1),
    )


def test_meta_env_disaggregated_is_multinode_with_both_roles() -> None:
    m = meta_env(_job("disagg"))
    assert m["is_multinode"] is True and m["framework"] == "vllm" and m["conc"] == 64
    assert (m["tp"], m["ep"], m["dp_attention"]) == (4, 4, False)  # InferenceX: prefill's
    assert (m["prefill_tp"], m["prefill_ep"], m["prefill_num_workers"]) == (4, 4, 2)
    assert (m["decode_tp"], m["decode_ep"], m["decode_dp_attention"], m["decode_num_workers"]) == (8, 1, True, 1)
    assert m["isl"] == "1024" and m["osl"] == "128"  # strings, as InferenceX writes them


def test_meta_env_aggregated_is_single_node() -> None:
    job = _job("aggregated")
    m = meta_env(EvalJob(**{**job.__dict__, "decode": job.prefill}))
    assert m["is_multinode"] is False and m["decode_tp"] == m["prefill_tp"] == m["tp"] == 4


def test_lm_eval_command() -> None:
    task = AccuracyTask(name="pdbench_copy", num_fewshot=0, limit=16)
    ep = Endpoint("http://127.0.0.1:30000", "copy", "local-completions", "/m/tok", 2048)
    argv = lm_eval_argv("/opt/lm/bin/python", task, ep, 4, Path("/out"), FIXTURE, request_timeout_s=600)
    assert argv[:4] == ["/opt/lm/bin/python", "-m", "lm_eval", "run"]  # accuracy.python's, not pdbench's
    args = {flag: argv[i + 1] for i, flag in enumerate(argv) if flag.startswith("--") and flag != "--log_samples"}
    assert args["--model"] == "local-completions" and args["--tasks"] == "pdbench_copy"
    assert args["--limit"] == "16" and args["--num_fewshot"] == "0" and args["--include_path"] == str(FIXTURE)
    model_args = dict(kv.split("=") for kv in args["--model_args"].split(","))
    assert model_args["base_url"] == "http://127.0.0.1:30000/v1/completions"
    assert model_args["num_concurrent"] == "4" and model_args["tokenizer"] == "/m/tok"
    assert model_args["tokenized_requests"] == "False"
    chat = lm_eval_argv(
        "py", AccuracyTask(), Endpoint("http://h:1", "m", "local-chat-completions", "t", 8), 1, Path("/o"), None, 5
    )
    assert "--apply_chat_template" in chat and "tokenizer=t" not in " ".join(chat)
    with pytest.raises(ValueError, match="model=a,b"):
        ep = Endpoint("http://h:1", "a,b", "local-completions", "t", 8)
        lm_eval_argv("py", AccuracyTask(), ep, 1, Path("/o"), None, 5)


def test_the_interpreter_is_accuracy_python_under_the_checkout() -> None:
    """lm-eval runs in its own venv by default (.venv-lmeval, beside pdbench's, as aiperf's);
    null: pdbench's own Python (lm-eval installed as pdbench[accuracy])."""
    assert LMEVAL_VENV == ".venv-lmeval"
    assert lm_eval_python(AccuracySpec()) == str(CHECKOUT / ".venv-lmeval" / "bin" / "python")
    assert lm_eval_python(AccuracySpec(python="/opt/lm/bin/python")) == "/opt/lm/bin/python"
    assert lm_eval_python(AccuracySpec(python=None)) == sys.executable
    dumped = Recipe.model_validate(_recipe(enabled=True)).model_dump(mode="json")
    assert dumped["accuracy"]["python"] == ".venv-lmeval/bin/python"  # in the lock as given


def test_node_zero_preflight_checks_the_eval_inputs(tmp_path: Path) -> None:
    """A job (and so `pdbench doctor`) finds a missing task directory in node 0's preflight, before
    any server starts, not after the sweep."""

    missing = tmp_path / "no-such-tasks"
    overrides = ["accuracy.enabled=true", f'accuracy.tasks=[{{"name": "t", "include_path": "{missing}"}}]']
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", overrides)
    render_job(rr, run_dir, current_context(run_dir, rr.root, rr))
    plan = PlanFile.model_validate_json((run_dir / "plan.json").read_text())
    head = checks_for(plan, plan.proxy_node, run_dir)
    assert "accuracy" in head and "accuracy" not in checks_for(plan, 1, run_dir)
    assert head["accuracy"]()[0] == f"accuracy.tasks[0].include_path: {missing} is not a directory"
