"""Real-vLLM jobs on the local launcher: start, Ctrl-C, wait, and the checks every end-to-end test makes
(nothing left running, outputs matched, runtime recorded).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import harness
from harness.render.vllm_flags import vllm_version
from harness.validity.series import Scrape, delta
from helpers import tokenizer_cache


def jsonl_by_id(directory: Path, pattern: str) -> dict[str, dict]:
    lines = [json.loads(x) for f in sorted(directory.glob(pattern)) for x in f.read_text().splitlines()]
    return {x["id"]: x for x in lines}


RECIPE = "tiny-fp32-cpu-nixl-1p1d"
# vLLM's flag check imports vLLM in the submitting process (about 20 s of CPU here, before any
# server starts) and caches per serve line, which the tests' ports make distinct: the real-vLLM
# jobs skip it but one (test_e2e_vllm's 1P1D-and-replicas job); tests/render/test_vllm_flags.py and
# test_doctor.py check real serve lines with it.
SKIP_FLAG_CHECK = ("--skip-flag-check",)

PORTS = {8100, 8200, 30000, 5600, 5601}


class ProcessWatcher:
    """Records every descendant of a process while it runs, to check none outlives the job."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for p in self.root.children(recursive=True):
                    try:
                        self.seen.setdefault(p.pid, p.create_time())
                    except psutil.NoSuchProcess:
                        pass
            except psutil.NoSuchProcess:
                return
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def survivors(self) -> list[str]:
        alive = []
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 1 and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {p.name()} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return alive


def listening_ports(ports: set[int]) -> set[int]:
    return {
        c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port in ports
    }


def launch(
    results: Path,
    *overrides: str,
    recipe: str = RECIPE,
    extra: tuple[str, ...] = (),
    ports: set[int] = PORTS,
    flag_check: bool = False,
) -> tuple[subprocess.Popen, ProcessWatcher]:
    """Submit the recipe with the local launcher, its output piped. vLLM's flag check is skipped
    unless asked for (SKIP_FLAG_CHECK)."""
    assert not listening_ports(ports), f"ports already in use: {listening_ports(ports)}"
    tokenizer_cache.seed(results)
    args = [
        sys.executable,
        "-m",
        "harness",
        "submit",
        "--recipe",
        recipe,
        "--launcher",
        "local",
        "--results-dir",
        str(results),
        *(() if flag_check else SKIP_FLAG_CHECK),
        *extra,
    ]
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    return proc, ProcessWatcher(proc.pid)


def _default_sigint() -> None:
    # The launcher gets Ctrl-C's SIGINT as a terminal's foreground job does. A shell without
    # job control starts background commands (a CI runner's, say) with SIGINT ignored, and
    # Python keeps an ignored SIGINT ignored: reset it, so the test does not depend on that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, watcher: ProcessWatcher, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Ctrl-C first, as a user would: the launcher tears its nodes down. They run in sessions of
        # their own, so a SIGKILL of its group alone leaves them serving into the next test.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
        pytest.fail(f"the job did not end within {timeout} s:\n{out[-4000:]}")
    finally:
        watcher.stop()
    return proc.returncode, out


def assert_nothing_left(watcher: ProcessWatcher, ports: set[int] = PORTS) -> None:
    deadline = time.monotonic() + 10
    while watcher.survivors() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert watcher.survivors() == []
    assert len(watcher.seen) >= 3  # the watcher did see the job's processes
    assert not listening_ports(ports)


def only_run_dir(results: Path, recipe: str = RECIPE) -> Path:
    (run_dir,) = (results / recipe).iterdir()
    return run_dir


def metric_delta(run_dir: Path, server: str, pattern: str, **labels: str) -> float:
    """Counter increase over the whole sweep, from the node runtime's scrapes."""
    scrape = lambda phase: Scrape.parse((run_dir / "metrics" / f"{server}.{phase}.prom").read_text())  # noqa: E731
    found = delta(scrape("before"), scrape("after"), pattern, **labels)
    assert found is not None, f"{server} exports no {pattern}"
    return found[0]


@functools.cache
def _installed_vllm_reports() -> str:
    """vllm.__version__ of the installed vLLM (what its server's /version serves)."""
    r = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def assert_runtime_recorded(meta: dict, servers: frozenset[str] = frozenset({"prefill-0", "decode-0"})) -> None:
    """What ran is recorded, not what was asked for: each server's own vLLM version (its GET
    /version) and its interpreter's packages, as installed here; no container, said so."""
    assert set(meta["runtime_versions"]) == servers
    for name, server in meta["runtime_versions"].items():
        assert server["vllm"] == _installed_vllm_reports(), (name, server)
        assert server["vllm_package"] == vllm_version() is not None, (name, server)
        assert server["torch"] == importlib.metadata.version("torch"), (name, server)
        assert server["nixl"] == importlib.metadata.version("nixl"), (name, server)
        assert server["pdbench"] == harness.__version__ and server["python"] == os.path.normpath(sys.executable)
        assert "vllm" not in server["reasons"] and "torch" not in server["reasons"]
    image = meta["image_digest"]
    assert image["digest"] is None and "container.runtime is none" in image["reason"], image


def assert_outputs_match(r: dict, run_dir: Path, reference: str = "prefill-0") -> None:
    """The point's sentinels, answered through the deployment, equal the reference instance's
    own whole answers token for token (the copy model reads its answer out of the prompt's KV)."""
    s = r["sentinels"]
    assert s["sent"] == s["answered"] == s["compared"] == s["exact"] == s["matched"] == 4, s
    assert s["unit"] == "token" and s["first_divergence"] == [None] * 4 and s["reference"].startswith(f"{reference}:")
    rules = {x["name"]: x for x in r["metadata"]["validity"]["rules"]}
    assert rules["outputs_match"]["status"] == "passed", rules["outputs_match"]
    rows = json.loads((run_dir / s["record"]).read_text())["sentinels"]
    assert all(len(x["answer"]["token_ids"]) == r["random_output_len"] for x in rows), rows
