"""The example GitHub Actions workflow: valid against the workflow schema, its shell steps pass
shellcheck (the checks actionlint would run; actionlint itself does not install from PyPI here),
and it does what the README says: set up, submit and wait, collect, upload, post the table."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "pdbench.yml"


def _tool(name: str) -> str:
    exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail(f"{name} is not installed (scripts/setup.sh installs the test extra)")
    return exe


def _load() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list[dict]:
    return _load()["jobs"]["benchmark"]["steps"]


def test_schema() -> None:
    r = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_run_steps_pass_shellcheck(tmp_path: Path) -> None:
    for i, step in enumerate(s for s in _steps() if "run" in s):
        # Expressions are substituted before bash runs; stand in a quoted word for each.
        body = re.sub(r"\$\{\{[^}]*\}\}", "GHA_EXPR", step["run"])
        script = tmp_path / f"step{i}.sh"
        script.write_text("#!/usr/bin/env bash\nset -eo pipefail\n" + body)
        r = subprocess.run([_tool("shellcheck"), str(script)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{step.get('name')}:\n{r.stdout}"


def test_structure() -> None:
    wf = _load()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["workflow_dispatch"]["inputs"]["recipe"]["required"] is True
    assert "pull_request" in on
    job = wf["jobs"]["benchmark"]
    assert job["runs-on"] == ["self-hosted", "slurm"]
    assert job["permissions"]["pull-requests"] == "write"
    assert wf["defaults"]["run"]["shell"] == "bash"
    assert job["env"]["RECIPE"].startswith("${{ inputs.recipe")
    steps = _steps()
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    runs = [s.get("run", "") for s in steps]
    assert uses[0] == "actions/checkout"
    assert "scripts/setup.sh" in runs[2]
    # The hardware label: required, never a default (the default recipe runs on MI355X, not H200).
    hw = on["workflow_dispatch"]["inputs"]["hw"]
    assert hw["required"] is True and "default" not in hw
    assert job["env"]["RUNNER_TYPE"] == "${{ inputs.hw || vars.PDBENCH_HW }}"
    assert "h200" not in WORKFLOW.read_text()
    check = steps[1]
    assert check["name"] == "Check the hardware label" and '[ -z "$RUNNER_TYPE" ]' in check["run"]
    assert "exit 1" in check["run"] and "PDBENCH_HW" in check["run"]
    submit = next(s for s in steps if "pdbench submit" in s.get("run", ""))
    assert submit["id"] == "submit"
    assert '--recipe "$RECIPE" --wait' in submit["run"] and "GITHUB_OUTPUT" in submit["run"]
    after = steps[steps.index(submit) + 1 :]
    text = "\n".join(s.get("run", "") for s in after)
    assert 'pdbench collect "$RUN_DIR" --out' in text
    assert "pdbench report" in text and "--baseline" in text and "--plot out/pareto.png" in text
    assert 'cat out/report.md >> "$GITHUB_STEP_SUMMARY"' in text
    # Collect, report and upload run even when the job failed, as long as a run directory exists.
    for s in after:
        assert s["if"].startswith("always()"), s.get("name")
    upload = next(s for s in after if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert "out/" in upload["with"]["path"]
    comment = next(s for s in after if s.get("uses", "").startswith("actions/github-script@"))
    assert "github.event_name == 'pull_request'" in comment["if"]
    assert "createComment" in comment["with"]["script"] and "updateComment" in comment["with"]["script"]


def test_hardware_check_stops_without_a_label(tmp_path: Path) -> None:
    step = next(s for s in _steps() if s.get("name") == "Check the hardware label")
    script = tmp_path / "check.sh"
    script.write_text("set -eo pipefail\n" + step["run"])
    env = {"PATH": "/usr/bin:/bin", "RECIPE": "dsr1-fp8-mi355x-moriio-1p2d"}
    r = subprocess.run(["bash", str(script)], env=env | {"RUNNER_TYPE": ""}, capture_output=True, text=True)
    assert r.returncode == 1 and "hardware label unknown for recipe dsr1-fp8-mi355x-moriio-1p2d" in r.stdout
    r = subprocess.run(
        ["bash", str(script)], env=env | {"RUNNER_TYPE": "mi355x-disagg"}, capture_output=True, text=True
    )
    assert r.returncode == 0 and "on mi355x-disagg" in r.stdout
