"""The recipe's `accuracy:` section: lm-eval tasks run against the job's own proxy.

The eval runs on node 0 after a phase's sweep (and before it, with `when: before_and_after`)
while that phase's servers are still up; a score under its threshold fails the job.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, PositiveInt, field_validator, model_validator

from harness.config.checkout import in_checkout
from harness.strict import Strict

# Where scripts/setup.sh puts lm-eval: a venv of its own. In pdbench's venv, the one vLLM runs
# from, it would bring scikit-learn and pandas into every vLLM process's imports (transformers
# imports sklearn.metrics when it is installed) and its pins would fight vLLM's.
LMEVAL_VENV = ".venv-lmeval"

# lm-eval task and metric names end up as argv words and JSON keys, never in a shell script.
_TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_METRIC = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)?")


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(v: str) -> str:
        if not pattern.fullmatch(v):
            raise ValueError(f"{v!r} is not {what}")
        return v

    return AfterValidator(check)


TaskName = Annotated[str, _matching(_TASK_NAME, "an lm-eval task name (letters, digits, '_', '.', '-')")]
MetricKey = Annotated[
    str, _matching(_METRIC, "an lm-eval metric key: '<metric>' or '<metric>,<filter>' (e.g. exact_match,strict-match)")
]
Phase = Literal["disagg", "aggregated"]


class AccuracyTask(Strict):
    name: TaskName = Field("gsm8k", description="lm-eval task name")
    num_fewshot: int | None = Field(None, ge=0, description="lm-eval --num_fewshot; default: the task's own")
    limit: PositiveInt | None = Field(None, description="lm-eval --limit: the first N samples; default: all")
    threshold: float | None = Field(
        None, ge=0, le=1, description="a score below this fails the job; none: recorded, never judged"
    )
    metric: MetricKey = Field(
        "exact_match,strict-match",
        description="key of lm-eval's results[task] judged against the threshold ('<metric>,<filter>')",
    )
    include_path: str | None = Field(
        None,
        description=(
            "directory of local lm-eval task YAMLs (lm-eval --include_path); relative to pdbench's checkout "
            "on the nodes"
        ),
    )


class AccuracySpec(Strict):
    enabled: bool = Field(False, description="run lm-eval against the job's proxy")
    tasks: list[AccuracyTask] = Field(
        [{"name": "gsm8k"}],
        validate_default=True,
        min_length=1,
        description="the lm-eval tasks, each judged alone",
    )
    concurrency: PositiveInt | None = Field(
        None, description="lm-eval's num_concurrent; default: the sweep's highest concurrency (as InferenceX)"
    )
    when: Literal["after", "before_and_after"] = Field(
        "after",
        description="after each phase's sweep; before_and_after also before it, so a drop over the run shows",
    )
    model_type: Literal["local-completions", "local-chat-completions"] = Field(
        "local-completions", description="lm-eval --model: /v1/completions or /v1/chat/completions"
    )
    timeout_s: float = Field(
        3600,
        gt=0,
        description=(
            "bound on one eval (all tasks of one phase at one time); the nodes' wait for the end of a phase "
            "grows by this for each eval of the phase"
        ),
    )
    phases: list[Phase] | None = Field(
        None,
        description=(
            "phases evaluated: disagg, aggregated (the job's aggregated baseline); default: every phase the job runs"
        ),
    )
    python: str | None = Field(
        f"{LMEVAL_VENV}/bin/python",
        description=(
            "the Python that runs lm-eval (`python -m lm_eval`): an absolute path, or a path relative to pdbench's "
            f"own checkout, where scripts/setup.sh creates {LMEVAL_VENV}; null: pdbench's own Python, with "
            "lm-eval installed beside pdbench (pdbench[accuracy])"
        ),
    )

    @field_validator("python")
    @classmethod
    def _nonempty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty path: give the Python that runs lm-eval, or null for pdbench's own")
        return v

    @model_validator(mode="after")
    def _unique(self) -> AccuracySpec:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks: each task once (got {names})")
        if self.phases is not None and (not self.phases or len(set(self.phases)) != len(self.phases)):
            raise ValueError(f"phases: one or both of disagg, aggregated, each once (got {self.phases})")
        return self

    @property
    def whens(self) -> tuple[str, ...]:
        return ("before", "after") if self.when == "before_and_after" else ("after",)

    def evaluated(self, job_phases: list[str] | tuple[str, ...]) -> list[str]:
        """The job's phases this section evaluates (none when disabled)."""
        if not self.enabled:
            return []
        return [p for p in job_phases if self.phases is None or p in self.phases]

    def concurrency_for(self, sweep: list[int]) -> int:
        return self.concurrency if self.concurrency is not None else max(sweep)


def problems(spec: AccuracySpec, job_phases: list[str] | tuple[str, ...], root: Path) -> list[str]:
    """What would make the eval fail for want of its inputs, each naming its key; [] when none.

    lm-eval itself and the datasets of tasks without include_path (from the Hugging Face cache)
    are checked by harness.evals on the node, asking accuracy.python.
    """
    if not spec.enabled:
        return []
    out = []
    if spec.phases is not None:
        absent = [p for p in spec.phases if p not in job_phases]
        if absent:
            out.append(
                f"accuracy.phases: {', '.join(absent)} is not a phase of this job (it runs {', '.join(job_phases)})"
            )
    for i, t in enumerate(spec.tasks):
        if t.include_path is not None and not in_checkout(t.include_path, root).is_dir():
            out.append(f"accuracy.tasks[{i}].include_path: {in_checkout(t.include_path, root)} is not a directory")
    return out
