"""The Python that runs lm-eval (accuracy.python), asked in bounded subprocesses.

pdbench's own process never imports lm_eval nor reads its metadata: lm-eval lives in a venv of
its own (harness.config.accuracy.LMEVAL_VENV), so whether it is there, its version and its task
index are that interpreter's answers, each within a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.config.accuracy import LMEVAL_VENV, AccuracySpec
from harness.config.checkout import in_checkout

VERSION_TIMEOUT_S = 30.0  # no import of lm_eval: a Python start (0.1 s here)
# lm-eval's task index reads each of its ~14,700 task YAMLs: about 20 s on this 2-core CPU.
TASK_INDEX_TIMEOUT_S = 180.0

_NO_LM_EVAL = 3  # _VERSION's exit code when lm_eval is not importable there
_MARK = "pdbench-lm-eval-tasks: "  # the task index's answer, apart from what lm-eval logs to stdout

_VERSION = f"""
import importlib.metadata, importlib.util, sys
if importlib.util.find_spec("lm_eval") is None:
    sys.exit({_NO_LM_EVAL})
try:
    print(importlib.metadata.version("lm-eval"))
except importlib.metadata.PackageNotFoundError:
    print("unknown")
"""

# Each name lm-eval knows -> its dataset_path (None without one); a name it lacks is left out.
# (Run after _VERSION found lm_eval: an import error here is lm-eval's own, told as it is.)
_TASK_DATASETS = f"""
import json, sys
from lm_eval.tasks import TaskManager
index = TaskManager().task_index
out = {{n: (getattr(index[n], "cfg", None) or {{}}).get("dataset_path") for n in sys.argv[1:] if n in index}}
print({_MARK!r} + json.dumps(out))
"""


class LmEvalUnavailable(Exception):
    """accuracy.python cannot answer (it timed out, it failed); the message names the key."""


class LmEvalMissing(LmEvalUnavailable):
    """accuracy.python does not exist, or has no lm-eval."""


def lm_eval_python(spec: AccuracySpec) -> str:
    """The interpreter that runs lm-eval here: accuracy.python (relative: under pdbench's checkout),
    or this process's own when it is null."""
    return sys.executable if spec.python is None else str(in_checkout(spec.python))


def version(spec: AccuracySpec, env: dict[str, str] | None = None) -> str:
    """lm-eval's version in accuracy.python; raises LmEvalUnavailable (LmEvalMissing: not there)."""
    return _ask(spec, _VERSION, [], env, VERSION_TIMEOUT_S, "lm-eval's version").strip()


def task_datasets(spec: AccuracySpec, names: list[str], env: dict[str, str] | None = None) -> dict[str, str | None]:
    """Of `names`, those lm-eval's task index has, each with its Hugging Face dataset (None: none)."""
    out = _ask(spec, _TASK_DATASETS, names, env, TASK_INDEX_TIMEOUT_S, "lm-eval's task index")
    for line in reversed(out.splitlines()):
        if line.startswith(_MARK):
            found: dict[str, str | None] = json.loads(line[len(_MARK) :])
            return found
    raise LmEvalUnavailable(f"accuracy.python: {lm_eval_python(spec)} gave no task index: {_tail(out)}")


def _ask(
    spec: AccuracySpec, script: str, args: list[str], env: dict[str, str] | None, timeout_s: float, what: str
) -> str:
    """The script's stdout, run by accuracy.python within timeout_s (killed past it)."""
    python = lm_eval_python(spec)
    _exists(python)
    try:
        r = subprocess.run(
            [python, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise LmEvalUnavailable(f"accuracy.python: {python} did not give {what} within {timeout_s:g} s") from None
    except OSError as e:
        raise LmEvalMissing(f"accuracy.python: {python} cannot run: {e.strerror or e}") from None
    if r.returncode == _NO_LM_EVAL:
        raise LmEvalMissing(f"accuracy.python: lm-eval is not installed for {python} ({_install_hint(spec)})")
    if r.returncode != 0:
        raise LmEvalUnavailable(
            f"accuracy.python: {python} failed giving {what} (exit {r.returncode}): {_tail(r.stderr)}"
        )
    return r.stdout


def _exists(python: str) -> None:
    """A clear error for an interpreter that is not there, or a venv's link to one that is not."""
    path = Path(python)
    if path.exists():
        return
    if path.is_symlink():
        raise LmEvalMissing(
            f"accuracy.python: {python} links to {os.path.realpath(path)}, which does not exist here (a venv made "
            "with a Python this host or container lacks; docs/accuracy.md says what a container needs)"
        )
    raise LmEvalMissing(f"accuracy.python: {python} does not exist (scripts/setup.sh creates {LMEVAL_VENV})")


def _install_hint(spec: AccuracySpec) -> str:
    if spec.python is None:
        return "pdbench's own Python, accuracy.python null: pip install 'pdbench[accuracy]'"
    return f"scripts/setup.sh installs it into {LMEVAL_VENV}"


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-5:]) or "no output"
