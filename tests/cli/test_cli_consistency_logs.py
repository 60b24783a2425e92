"""`pdbench logs --follow` on a local run in progress, from another shell: it prints the end of
the log, then the lines the job writes afterwards, and stops by itself when the job ends.

The run is the local 1P1D recipe with a stand-in `vllm` that never gets healthy (as in
tests/cli/test_cli_local_run.py), so the job runs until `pdbench cancel` ends it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import port_base
from helpers.cli_run import pdbench as _cli

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "tiny-fp32-cpu-nixl-1p1d"
pytestmark = pytest.mark.timeout(240)


def _bin(bin_dir: Path) -> Path:
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "vllm").write_text("#!/usr/bin/env bash\nexec sleep 600\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir / "python"


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_logs_follow_prints_new_lines_until_the_job_ends(tmp_path: Path) -> None:
    results = tmp_path / "results"
    base = port_base(21700)
    argv = [sys.executable, "-m", "harness", "submit", RECIPE, "--launcher", "local", "--skip-flag-check"]
    argv += ["--results-dir", str(results)]
    for s in (
        f"topology.prefill.port={base}",
        f"topology.decode.port={base + 10}",
        f"connector.side_channel_port={base + 20}",
        f"proxy.port={base + 30}",
        "timeouts.health_s=120",  # the stand-in never gets healthy: the job's bound if cancel failed
        "timeouts.teardown_s=5",
    ):
        argv += ["--set", s]
    env = dict(os.environ, PDBENCH_PYTHON=str(_bin(tmp_path / "bin")))
    submit = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT, start_new_session=True
    )
    follower = None
    try:
        node_log = lambda: next(results.glob(f"{RECIPE}/*/logs/node0.log"), None)  # noqa: E731
        _wait_for(lambda: node_log() is not None and "prefill-0" in node_log().read_text(), 90, "the node's log")
        log = node_log()
        run = log.parent.parent
        follower = subprocess.Popen(
            [sys.executable, "-m", "harness", "logs", str(run), "--role", "node", "--node", "0", "-n", "0", "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        printed: list[str] = []
        reader = threading.Thread(target=lambda: printed.extend(follower.stdout), daemon=True)
        reader.start()
        # Precondition: it printed what the log held when it began, and still runs.
        _wait_for(lambda: any("prefill-0" in line for line in printed), 30, "the log's lines so far")
        before = len(log.read_text().splitlines())
        assert follower.poll() is None
        assert printed[0] == "==> logs/node0.log <==\n"

        assert _cli("cancel", str(run)).returncode == 0
        assert follower.wait(60) == 0, follower.stderr.read()
        reader.join(10)
        after = log.read_text().splitlines()
        assert len(after) > before  # the job wrote its teardown after following began
        body = [line.rstrip("\n") for line in printed[1:-1]]
        assert body == after, "followed output differs from the log"
        last = printed[-1]
        assert last.startswith(f"--- local job local-{run.name} (") and last.endswith(" ended: cancelled\n"), last
    finally:
        for proc in (follower, submit):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM) if proc is submit else proc.kill()
                proc.wait(60)
