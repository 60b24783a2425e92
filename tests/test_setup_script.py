"""scripts/setup.sh's background aiperf install, when the main install fails: the EXIT trap stops
the whole install, the processes its pip started included, not the subshell (or the pip it execs) alone.

setup.sh runs from a copy of the checkout whose Pythons are stand-ins: aiperf's `pip install`
starts a child, records its PID and waits; the main venv's first pip fails once that one runs."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_failed_main_install_stops_the_aiperf_pip(tmp_path: Path) -> None:
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "scripts/setup.sh", "scripts/setup_mooncake.sh"):
        shutil.copy(ROOT / name, tree / name)
    pip_pid = tmp_path / "aiperf-pip-child.pid"
    # aiperf's venv: not ready (-c); its pip install runs a step in a child process, as pip runs a
    # package's build, which stands until it is stopped.
    _script(
        tree / ".venv-aiperf" / "bin" / "python",
        f'[ "$1" = -c ] && exit 1\nsleep 300 &\necho $! > "{pip_pid}.part" && mv "{pip_pid}.part" "{pip_pid}"\nwait\n',
    )
    # The main venv: its first pip fails, once aiperf's pip is running (bounded).
    _script(
        tmp_path / "venv" / "bin" / "python",
        f'for _ in $(seq 300); do [ -f "{pip_pid}" ] && exit 1; sleep 0.1; done\necho "no aiperf pip" >&2\nexit 7\n',
    )
    _script(tmp_path / "stubs" / "chromium", "exit 0\n")  # setup.sh would install one with apt
    env = {**os.environ, "PDBENCH_VENV": str(tmp_path / "venv"), "PATH": f"{tmp_path / 'stubs'}:{os.environ['PATH']}"}
    env.pop("PDBENCH_NO_AIPERF", None)
    pid = None
    try:
        r = subprocess.run(["bash", "scripts/setup.sh"], cwd=tree, env=env, capture_output=True, text=True, timeout=90)
        # Precondition: the main install failed while aiperf's pip ran.
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        pid = int(pip_pid.read_text())
        deadline = time.monotonic() + 10  # its parent gone, init reaps it
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the child of aiperf's pip (pid {pid}) outlived setup.sh"
        assert "setup.sh: stopping the aiperf install" in r.stderr, r.stderr
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
