"""accuracy.python: lm-eval runs in a Python of its own (.venv-lmeval by default), and pdbench asks
that Python, in bounded subprocesses, whether lm-eval is there, its version and its task index;
pdbench's own process never imports lm_eval nor reads its metadata (its venv, vLLM's, need not
have lm-eval). The real .venv-lmeval answers here (scripts/setup.sh creates it); the eval itself
against real vLLM is tests/e2e/test_accuracy_e2e.py's."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import port_base

from harness.config.accuracy import AccuracySpec, AccuracyTask
from harness.config.checkout import CHECKOUT
from harness.config.load import PROJECT_ROOT
from harness.evals import interpreter
from harness.evals.command import Endpoint
from harness.evals.data import missing_data
from harness.evals.lm_eval_run import lm_eval_version, run_eval
from harness.evals.meta_env import EvalJob, Role

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "evals" / "pdbench_copy"
LMEVAL_PYTHON = CHECKOUT / ".venv-lmeval" / "bin" / "python"
RECIPE = "tiny-fp32-cpu-nixl-1p1d"


@pytest.fixture
def no_lm_eval_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """pdbench's process may neither import lm_eval nor read its metadata, though this venv may have it."""
    assert LMEVAL_PYTHON.exists(), f"{LMEVAL_PYTHON}: scripts/setup.sh creates .venv-lmeval"
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # an import of it raises ImportError
    real = importlib.metadata.distribution

    def guarded(name: str) -> importlib.metadata.Distribution:
        assert name.replace("_", "-").lower() != "lm-eval", "pdbench's own process read lm-eval's metadata"
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", guarded)


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _fake_python(path: Path, body: str) -> Path:
    """A stand-in for accuracy.python: a Python script that sees the argv pdbench gives it, run by
    this Python without its site-packages (-S: no lm_eval)."""
    return _script(path, f"#!{sys.executable} -S\nimport json, sys, time\nfrom pathlib import Path\n{body}")


def _installed_version() -> str:
    """lm-eval's version in .venv-lmeval, read from its files (never through an import here)."""
    (dist,) = LMEVAL_PYTHON.parent.parent.glob("lib/python*/site-packages/lm_eval-*.dist-info")
    return dist.name.removeprefix("lm_eval-").removesuffix(".dist-info")


def test_the_version_and_lm_eval_itself_are_asked_of_accuracy_python(no_lm_eval_here: None) -> None:
    spec = AccuracySpec(enabled=True)  # the default: .venv-lmeval under the checkout
    assert lm_eval_version(spec) == _installed_version()
    assert missing_data(spec, env={**os.environ, "HF_HUB_OFFLINE": ""}) == []  # online: lm-eval is there


def test_offline_registry_tasks_are_looked_up_in_accuracy_python(tmp_path: Path, no_lm_eval_here: None) -> None:
    """lm-eval's own task index (a real one, ~20 s here), asked in a subprocess; a task with its
    own include_path is not asked."""
    hub = tmp_path / "hub"
    (hub / "datasets--openai--gsm8k").mkdir(parents=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "HF_DATASETS_CACHE": str(tmp_path / "ds")}
    names = ["gsm8k", "arc_easy", "no_such_task_xyz"]
    tasks = [AccuracyTask(name=n) for n in names] + [AccuracyTask(name="pdbench_copy", include_path=str(FIXTURE))]
    assert missing_data(AccuracySpec(enabled=True, tasks=tasks), env) == [
        "accuracy task 'arc_easy': its dataset 'allenai/ai2_arc' is not in the Hugging Face cache "
        "(HF_HUB_CACHE / HF_DATASETS_CACHE) and this job is offline",
        "accuracy task 'no_such_task_xyz': lm-eval has no such task",
    ]


def test_a_missing_interpreter_or_one_without_lm_eval_names_accuracy_python(tmp_path: Path) -> None:
    def problems(python: str) -> list[str]:
        return missing_data(AccuracySpec(enabled=True, python=python))

    absent = CHECKOUT / ".venv-absent" / "bin" / "python"
    assert problems(".venv-absent/bin/python") == [
        f"accuracy.python: {absent} does not exist (scripts/setup.sh creates .venv-lmeval)"
    ]
    # A venv whose base interpreter is not here (a host's venv seen from a container).
    link = tmp_path / "venv-bin-python"
    link.symlink_to(tmp_path / "no-such-python3")
    (cause,) = problems(str(link))
    assert cause.startswith(f"accuracy.python: {link} links to {tmp_path / 'no-such-python3'}, which does not exist")
    bare = _script(tmp_path / "bare-python", f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # a Python without lm-eval
    assert problems(str(bare)) == [
        f"accuracy.python: lm-eval is not installed for {bare} (scripts/setup.sh installs it into .venv-lmeval)"
    ]
    assert lm_eval_version(AccuracySpec(python=str(bare))) == "not installed"


def test_a_hung_interpreter_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "VERSION_TIMEOUT_S", 0.5)
    monkeypatch.setattr(interpreter, "TASK_INDEX_TIMEOUT_S", 0.5)
    hung = _fake_python(tmp_path / "hung", "time.sleep(60)\n")
    start = time.monotonic()
    assert missing_data(AccuracySpec(enabled=True, python=str(hung))) == [
        f"accuracy.python: {hung} did not give lm-eval's version within 0.5 s"
    ]
    assert lm_eval_version(AccuracySpec(python=str(hung))) == "unknown"
    # Its version at once, its task index never.
    slow = _fake_python(tmp_path / "slow-index", "if 'TaskManager' in sys.argv[2]: time.sleep(60)\nprint('0.4.13')\n")
    offline = {**os.environ, "HF_HUB_OFFLINE": "1"}
    assert missing_data(AccuracySpec(enabled=True, python=str(slow)), offline) == [
        f"accuracy.python: {slow} did not give lm-eval's task index within 0.5 s"
    ]
    assert time.monotonic() - start < 10


RESULTS = {
    "results": {"pdbench_copy": {"exact_match,strict-match": 1.0, "exact_match_stderr,strict-match": 0.0}},
    "n-samples": {"pdbench_copy": {"original": 24, "effective": 16}},
}


def test_the_eval_runs_lm_eval_in_accuracy_python(tmp_path: Path, no_lm_eval_here: None) -> None:
    """run_eval's lm-eval is `<accuracy.python> -m lm_eval run ...`: a stand-in records its argv
    and writes lm-eval's results file."""
    record = tmp_path / "argv.json"
    fake = _fake_python(
        tmp_path / "lm-python",
        "if sys.argv[1] == '-c':\n    print('0.4.13+fake')\n    sys.exit(0)\n"
        f"Path({str(record)!r}).write_text(json.dumps(sys.argv[1:]))\n"
        "out = Path(sys.argv[sys.argv.index('--output_path') + 1]) / 'copy'\n"
        f"out.mkdir(parents=True)\n(out / 'results_1.json').write_text({json.dumps(RESULTS)!r})\n",
    )
    spec = AccuracySpec(
        enabled=True, python=str(fake), timeout_s=60, tasks=[AccuracyTask(name="pdbench_copy", threshold=0.9)]
    )
    role = Role(tp=1, ep=1, dp_attention=False, workers=1)
    job = EvalJob("disagg", "after", 2, "copy", "pdbench-copy", "fp32", "cpu", 128, 8, "f", role, role)
    ep = Endpoint("http://127.0.0.1:9", "copy", "local-completions", "/m/tok", 2048)
    summary = run_eval(spec, ep, job, tmp_path / "evals", tmp_path)
    assert summary.error is None and summary.passed is True and summary.lm_eval_version == "0.4.13+fake", summary
    argv = json.loads(record.read_text())
    assert argv[:5] == ["-m", "lm_eval", "run", "--model", "local-completions"], argv


def test_a_job_without_its_lm_eval_python_fails_before_any_server_starts(tmp_path: Path) -> None:
    """Node 0's preflight (what `pdbench doctor` runs too) names accuracy.python: submit exits 1."""
    base = port_base(25100)
    sets = [
        f"topology.prefill.port={base}",
        f"topology.decode.port={base + 10}",
        f"connector.side_channel_port={base + 20}",
        f"proxy.port={base + 30}",
        "accuracy.enabled=true",
        "accuracy.python=.venv-absent/bin/python",
    ]
    args = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--launcher", "local", "--skip-flag-check"]
    args += ["--results-dir", str(tmp_path / "results"), *(a for s in sets for a in ("--set", s))]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=PROJECT_ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    (run_dir,) = (tmp_path / "results" / RECIPE).iterdir()
    reason = json.loads((run_dir / "status.json").read_text())["reason"]
    cause = f"accuracy.python: {CHECKOUT / '.venv-absent/bin/python'} does not exist (scripts/setup.sh creates .venv-lmeval)"
    assert "preflight found" in reason and cause in reason, reason
    assert not list((run_dir / "logs").glob("prefill-*.log")) and not list((run_dir / "logs").glob("decode-*.log"))
