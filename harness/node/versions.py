"""What each of this node's servers runs on: its interpreter and that interpreter's package
versions (torch, the connector libraries, pdbench), one record per server in the run
directory's state/ (RunDir.server_record), read by the bench client into every
result's metadata (harness.bench.runtime_info). vLLM serves its own version (GET /version),
which the client asks each server for.

The interpreter is the server process's own argv[0] (a `vllm` script's shebang line puts the
interpreter there; a bare name is looked up on the process's own PATH), run with the process's
own environment from /proc, so it sees the packages the server imported, in the same container.
What cannot be had is null, with the reason; recording never fails the job.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from harness import atomic, kv_connectors
from harness.rundir import RunDir, package_probe

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = package_probe.PROBE_TIMEOUT_S
PACKAGE_KEYS = package_probe.keys(kv_connectors.packages())
# The environment variables that decide an interpreter's sys.path: servers that share the
# interpreter and these share one probe.
_PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")


@dataclass(frozen=True)
class Interpreter:
    python: str
    env: dict[str, str]

    @property
    def key(self) -> tuple[str, ...]:
        return (self.python, *(self.env.get(k, "") for k in _PATH_ENV))


# A server may run under a wrapper that starts it as a child (nsys profile, benchmark.profile.tool
# nsys): the interpreter is then its first python descendant's, this many generations down at most.
WRAPPER_DEPTH = 3
NOT_PYTHON = "does not name a python interpreter"


def server_interpreter(pid: int) -> Interpreter | str:
    """The interpreter process `pid` runs in, with the process's environment (or, when `pid` is
    a wrapper such as nsys, that of the nearest python descendant); or why it cannot be told."""
    found = _interpreter(pid)
    if isinstance(found, Interpreter) or not found.endswith(NOT_PYTHON):
        return found
    try:
        level = psutil.Process(pid).children()
        for _ in range(WRAPPER_DEPTH):
            for child in level:
                if isinstance(inner := _interpreter(child.pid), Interpreter):
                    return inner
            level = [c for p in level for c in p.children()]
    except psutil.Error:
        pass  # the wrapper or a child went: the wrapper's own reason stands
    return found


def _interpreter(pid: int) -> Interpreter | str:
    proc = Path("/proc") / str(pid)
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        raw_env = (proc / "environ").read_bytes().decode(errors="replace")
        cwd = os.readlink(proc / "cwd")
    except OSError as e:
        return f"cannot read process {pid} in /proc: {e}"
    env = dict(item.split("=", 1) for item in raw_env.split("\0") if "=" in item)
    first = argv[0].decode(errors="replace") if argv else ""
    if not Path(first).name.startswith("python"):
        # vLLM renames some of its processes (setproctitle); a server's own is left as it started.
        return f"process {pid}'s argv[0] {first[:200]!r} {NOT_PYTHON}"
    if os.sep in first:
        python: str | None = os.path.join(cwd, first)  # an absolute first stays as it is
    else:
        python = shutil.which(first, path=env.get("PATH", ""))
    if python is None or not os.access(python, os.X_OK):
        return f"process {pid}'s interpreter {first!r} is not an executable on its PATH"
    return Interpreter(os.path.normpath(python), env)


def probe(interp: Interpreter, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """package_probe's JSON from `interp`; raises RuntimeError saying why there is none."""
    source = Path(package_probe.__file__).read_text()
    try:
        r = subprocess.run(
            [interp.python, "-c", source, json.dumps(kv_connectors.packages())],
            env=interp.env,
            cwd="/",  # nothing of the run directory on sys.path
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{interp.python} did not report its packages within {timeout:g} s") from None
    except OSError as e:
        raise RuntimeError(f"cannot run {interp.python}: {e}") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        raise RuntimeError(f"{interp.python} exited with {r.returncode} reporting its packages: {last}")
    try:
        out = json.loads(r.stdout)
    except ValueError:
        raise RuntimeError(f"{interp.python} printed no JSON: {r.stdout[:200]!r}") from None
    if not (isinstance(out, dict) and isinstance(out.get("versions"), dict) and isinstance(out.get("reasons"), dict)):
        raise RuntimeError(f"{interp.python} printed an unexpected report: {r.stdout[:200]!r}")
    return out


def _unknown(reason: str) -> dict[str, Any]:
    return {
        "python": None,
        "python_version": None,
        "versions": dict.fromkeys(PACKAGE_KEYS),
        "reasons": dict.fromkeys(PACKAGE_KEYS, reason),
    }


def server_records(node: int, servers: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """name -> record for each server (name -> pid); one probe per distinct interpreter."""
    probes: dict[tuple[str, ...], dict[str, Any]] = {}
    records = {}
    for name, pid in servers.items():
        interp = server_interpreter(pid)
        if isinstance(interp, str):
            found = _unknown(interp)
        elif interp.key in probes:
            found = probes[interp.key]
        else:
            t0 = time.monotonic()
            try:
                found = probe(interp)
            except RuntimeError as e:
                found = _unknown(str(e)) | {"python": interp.python}
            log.info("%s: packages of %s read in %.2f s", name, interp.python, time.monotonic() - t0)
            probes[interp.key] = found
        records[name] = {"server": name, "node": node, "pid": pid} | found
    return records


def record_servers(run_dir: Path, node: int, servers: Mapping[str, int]) -> None:
    """Write each server's record into the run directory's state/; log what was found."""
    for name, rec in server_records(node, servers).items():
        found = ", ".join(f"{k} {v}" for k, v in rec["versions"].items() if v is not None) or "no package versions"
        log.info("%s runs %s: %s", name, rec["python"] or "an unknown interpreter", found)
        try:
            atomic.write_json(RunDir(run_dir).server_record(name), rec, indent=2)
        except OSError as e:
            log.warning("cannot record the versions %s runs: %s", name, e)
