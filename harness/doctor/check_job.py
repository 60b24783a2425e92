"""`pdbench doctor`'s pipeline: the submit pipeline's checks, then a short check job."""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness import atomic
from harness.config.load import PROJECT_ROOT, ConfigError, ResolvedRecipe
from harness.config.overrides import Overrides
from harness.doctor.findings import SUBMIT_HOST, Finding, job_findings, local_findings, node_passed
from harness.launch.job import Job, LaunchError
from harness.launch.launcher import Launcher
from harness.launch.local import LocalLauncher
from harness.launch.slurm import SlurmLauncher
from harness.render import current_context, render_job
from harness.rundir import RunDir
from harness.submit.check import ensure_model, flag_problems, load, planned, router_problems
from harness.submit.follow import say
from harness.submit.refused import Refused

# The check job's bounds: it only checks, so it needs minutes, not the benchmark's hours.
SLURM_CHECK_TIME = "00:10:00"
LOCAL_CHECK_LIMIT_S = 300


def check_launcher(kind: str, rr: ResolvedRecipe, timeout_s: float) -> Launcher:
    if kind == "local":
        return LocalLauncher(min(timeout_s, LOCAL_CHECK_LIMIT_S), rr.recipe.timeouts.teardown_s, echo=None)
    return SlurmLauncher([f"--time={SLURM_CHECK_TIME}"])


def doctor(
    recipe: str,
    overrides: Overrides | None,
    cluster: str | None,
    *,
    launcher_kind: str,
    as_json: bool,
    timeout_s: float,
    results_dir: Path,
    skip_flag_check: bool = False,
) -> int:
    """0 when every check passed, else 1 (after printing one line per problem, or the JSON)."""
    rr = load(recipe, overrides, cluster)
    launcher = check_launcher(launcher_kind, rr, timeout_s)
    p = planned(rr, launcher)
    ensure_model(rr)
    flags = None if skip_flag_check else flag_problems(p)  # None: not checked
    findings = [Finding(SUBMIT_HOST, "vllm-flags", problem) for problem in flags or []]
    findings += [Finding(SUBMIT_HOST, "vllm-router", problem) for problem in router_problems(p)]
    findings += local_findings(rr, p.plan, str(rr.root))
    # The check job's run directory is kept apart from the benchmark runs (results/.doctor/).
    run = RunDir.create(results_dir / ".doctor", rr.name)
    try:
        render_job(rr, run.path, current_context(run.path, PROJECT_ROOT, rr), p.plan)
    except ConfigError as e:
        raise Refused(str(e)) from None
    atomic.write_json(run.doctor_marker, {"created": time.time()}, indent=2)
    num_nodes = p.plan.num_nodes
    if not as_json:
        say(f"checking {num_nodes} node(s) of {rr.name} ({launcher.name}); run directory {run.path}")
    start = time.monotonic()
    job: Job | None = None
    try:
        job = launcher.launch(run, num_nodes)
        job.wait(timeout_s)
    except LaunchError as e:
        findings.append(Finding("job", launcher.name, str(e)))
        if job is not None:
            job.cancel()
    findings += job_findings(run.path, num_nodes)
    took = time.monotonic() - start
    # What passed, so "ok" says what was checked: vLLM's flag check runs only where vLLM is installed.
    passed = [(SUBMIT_HOST, ["vllm-flags"])] if flags == [] else []
    passed += [(where, checks) for where, checks in node_passed(run.path, num_nodes) if checks]
    if as_json:
        problems = [f.to_json() for f in findings]
        result = {"ok": not findings, "recipe": rr.name, "run_dir": str(run.path), "seconds": round(took, 1)}
        ran = [{"where": where, "checks": checks} for where, checks in passed]
        say(json.dumps({**result, "problems": problems, "passed": ran}, indent=2))
    else:
        for where, checks in passed:
            say(f"passed: {where}: {', '.join(checks)}")
        for f in findings:
            say(str(f))
        verdict = "ok" if not findings else f"{len(findings)} problem(s)"
        say(f"{verdict}: {num_nodes} node(s) checked in {took:.1f} s")
    return 0 if not findings else 1
