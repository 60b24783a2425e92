"""Checks every node of a job runs before it starts any server (and `pdbench doctor` runs).

A job on a GPU cluster that dies 20 minutes in, after loading a model, because a port was
taken, a GPU held by an orphaned container or a weight shard missing costs hours; these
checks find such faults in seconds. Each check returns a list of problem strings (empty:
fine) that name the cause and say what to do. None of them can hang: every external tool
runs with a timeout (and a tool that times out or fails is itself a problem), and
run_checks bounds each check again. Which checks apply to a node is decided in
harness.node.node_checks.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.node import nic

# Holder lookup for a taken port scans /proc/*/fd; bounded so a host with many processes
# (or a slow /proc) cannot stall the check.
HOLDER_SCAN_S = 2.0
# An idle GPU shows a few MiB (up to a few hundred with persistence mode / ECC); more than
# this with no process listed means something outside this container holds it.
IDLE_GPU_MIB = 2048
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
# Files with a weights suffix that are not model weights (checkpoint leftovers).
NOT_WEIGHTS = frozenset({"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.pt"})
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a huge page-rounded number

_now = time.time  # check_clock's clock; tests replace it to simulate skew


# --------------------------------------------------------------------------- helpers


def _fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _uid() -> str:
    return f"uid {os.getuid()}"


def _few(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class _ToolFailed(Exception):
    """An external tool could not be run, failed, or did not answer in time; str() says which."""


def _run_tool(argv: Sequence[str], timeout: float, env: Mapping[str, str], limit_s: float) -> tuple[str, int]:
    """stdout and pid of `argv`, bounded by `timeout` seconds (what is left of the check's
    `limit_s`, which the message names).

    The tool runs in its own session so that on timeout its whole process group is killed
    (a wrapper script's children included); a process stuck in the kernel (a hung driver)
    cannot be killed at all, so after the kill we wait at most a second for its output.
    """
    shown = " ".join([Path(argv[0]).name, *argv[1:]])
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=dict(env),
            start_new_session=True,
        )
    except OSError as e:
        raise _ToolFailed(f"could not run `{shown}`: {e.strerror or e}") from None
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        raise _ToolFailed(f"`{shown}` did not answer within {limit_s:g} s") from None
    if proc.returncode != 0:
        tail = " / ".join(line.strip() for line in (err or out or "").strip().splitlines()[-2:] if line.strip())
        raise _ToolFailed(f"`{shown}` failed (exit {proc.returncode}{': ' + tail if tail else ''})")
    return out, proc.pid


# --------------------------------------------------------------------------- ports


def _listen_inodes(port: int, proc_net: Path) -> set[str]:
    """Socket inodes bound to `port` (listening, or bound and not connected) in this network namespace."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10:
                continue
            local, state, inode = cols[1], cols[3], cols[9]
            try:
                local_port = int(local.rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            # 0A LISTEN; 07 CLOSE is a socket bound but not listening, which also takes the port.
            if local_port == port and state in ("0A", "07") and inode != "0":
                inodes.add(inode)
    return inodes


def _port_holder(port: int, deadline: float, proc: Path = Path("/proc")) -> str | None:
    """'pid 1234 python3' for the process holding `port`, or None when it cannot be seen
    (another PID namespace, another user's process without privileges, or out of time)."""
    inodes = _listen_inodes(port, proc / "net")
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if time.monotonic() > deadline:
            return None
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if link in targets:
                try:
                    comm = (proc / pid / "comm").read_text().strip()
                except OSError:
                    comm = ""
                return f"pid {pid} {comm}".rstrip()
    return None


def check_ports(ports: list[int], host: str = "0.0.0.0") -> list[str]:
    """Every TCP port this node's servers bind must be free (bound like servers bind it: with
    SO_REUSEADDR, so a socket in TIME_WAIT from an earlier run does not count)."""
    problems: list[str] = []
    deadline = time.monotonic() + HOLDER_SCAN_S
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    seen: set[int] = set()
    for port in ports:
        if not isinstance(port, int) or not 0 < port < 65536:
            problems.append(f"port {port!r} is not a TCP port number (1-65535); fix the recipe's ports")
            continue
        if port in seen:
            problems.append(
                f"port {port} is assigned twice on this node; two servers would collide (fix the recipe's ports)"
            )
            continue
        seen.add(port)
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                holder = _port_holder(port, deadline)
                by = f" (by {holder})" if holder else ""
                problems.append(
                    f"port {port} is in use{by}; stop that process (a server left over from an earlier job?) "
                    "or move the recipe's ports"
                )
            elif e.errno == errno.EACCES:
                problems.append(
                    f"port {port} cannot be bound on {host}: permission denied "
                    "(ports below 1024 need root); move the recipe's ports"
                )
            elif e.errno == errno.EADDRNOTAVAIL:
                problems.append(f"port {port} cannot be bound on {host}: that address is not on this node")
            else:
                problems.append(f"port {port} cannot be bound on {host}: {e.strerror or e}")
    return problems


# --------------------------------------------------------------------------- GPUs


def _busy_text(holders: list[tuple[int | None, str, float | None]]) -> str:
    parts = []
    for pid, name, mib in holders:
        who = f"pid {pid}" + (f" ({name})" if name else "") if pid is not None else (name or "a process")
        parts.append(
            f"{who} holds {mib:.0f} MiB" if mib is not None else f"{who} holds GPU memory (amount not reported)"
        )
    return ", ".join(parts)


_BUSY_HINT = "(an orphaned container or another job?); stop it, or have the node drained, before the run"


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _nvidia(tool: str, expected: int, env: Mapping[str, str], limit_s: float) -> list[str]:
    deadline = time.monotonic() + limit_s
    try:
        gpus_out, _ = _run_tool(
            [tool, "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"],
            deadline - time.monotonic(),
            env,
            limit_s,
        )
    except _ToolFailed as e:
        return [
            f"{e}; the recipe needs {expected} GPU(s) on this node (check the GPU driver and that the "
            "container is given the GPUs; `nvidia-smi` on the node shows the same error)"
        ]
    index_of: dict[str, int] = {}
    used: dict[int, float | None] = {}
    for line in gpus_out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 2 or _int(cols[0]) is None:
            continue
        idx = _int(cols[0])
        assert idx is not None
        index_of[cols[1]] = idx
        used[idx] = _float(cols[2]) if len(cols) > 2 else None
    problems: list[str] = []
    if len(used) < expected:
        problems.append(
            f"{len(used)} GPU(s) visible, the recipe needs {expected} on this node "
            "(the container or the Slurm allocation does not expose them all: check --gres / the container's GPU flags)"
        )
    try:
        apps_out, _ = _run_tool(
            [tool, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
            deadline - time.monotonic(),
            env,
            limit_s,
        )
    except _ToolFailed as e:
        return [*problems, f"{e}; cannot tell whether the GPUs are free"]
    holders: dict[str, list[tuple[int | None, str, float | None]]] = {}
    for line in apps_out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 2 or _int(cols[1]) is None:
            continue  # "No running processes found" and the like
        mib = _float(cols[2]) if len(cols) > 2 else None
        if mib is not None and mib <= 0:
            continue
        holders.setdefault(cols[0], []).append((_int(cols[1]), "", mib))
    for uuid, procs in sorted(holders.items(), key=lambda kv: (index_of.get(kv[0], 1 << 30), kv[0])):
        where = f"GPU {index_of[uuid]}" if uuid in index_of else f"the GPU with uuid {uuid}"
        problems.append(f"{where} is busy: {_busy_text(procs)} {_BUSY_HINT}")
    busy = {index_of[u] for u in holders if u in index_of}
    for idx, mib in sorted(used.items()):
        if idx not in busy and mib is not None and mib > IDLE_GPU_MIB:
            problems.append(
                f"GPU {idx} has {mib:.0f} MiB in use but nvidia-smi lists no process on it (a process in another "
                "container or PID namespace, e.g. an orphaned container from an earlier job?); "
                "free it, or have the node drained, before the run"
            )
    return problems


def _json_from(text: str) -> object:
    """The first JSON value in `text` (amd-smi may print warnings before it)."""
    starts = [i for i in (text.find("["), text.find("{")) if i >= 0]
    if not starts:
        raise ValueError("no JSON in the output")
    value, _ = json.JSONDecoder().raw_decode(text[min(starts) :])
    return value


def _entries(data: object) -> list[dict]:
    """amd-smi's per-GPU entries: a list of dicts, a single dict, or a dict wrapping a list."""
    if isinstance(data, list):
        return [d for d in data if isinstance(d, dict)]
    if isinstance(data, dict):
        if "gpu" in data:
            return [data]
        for value in data.values():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                return list(value)
        return [v for v in data.values() if isinstance(v, dict)]
    return []


_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30, "gib": 1 << 30}


def _amd_bytes(value: object) -> float | None:
    """A memory amount from amd-smi JSON: 123, "123 MB", {"value": 123, "unit": "B"}; None if not given."""
    unit = "b"
    if isinstance(value, dict):
        unit = str(value.get("unit", "B")).strip().lower()
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) * _UNITS.get(unit, 1)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", value)
        if m:
            try:
                return float(m.group(1)) * _UNITS.get(m.group(2).lower(), 1)
            except ValueError:
                return None
    return None


def _amd_holders(entry: dict, tool_pid: int) -> list[tuple[int | None, str, float | None]]:
    plist = entry.get("process_list", entry.get("processes", []))
    if not isinstance(plist, list):
        return []
    out: list[tuple[int | None, str, float | None]] = []
    for item in plist:
        info = item.get("process_info", item) if isinstance(item, dict) else item
        if not isinstance(info, dict):
            continue  # "No running processes detected"
        pid = info.get("pid")
        pid = pid if isinstance(pid, int) else _int(str(pid)) if pid is not None else None
        if pid == tool_pid:
            continue  # newer amd-smi lists itself
        usage = info.get("memory_usage")
        candidates = [usage.get("vram_mem")] if isinstance(usage, dict) else []
        candidates += [info.get("vram_mem"), info.get("mem_usage"), info.get("mem")]
        amounts = [b for b in (_amd_bytes(c) for c in candidates) if b is not None]
        if amounts and amounts[0] > 0:
            out.append((pid, str(info.get("name") or ""), amounts[0] / (1 << 20)))
    return out


def _amd(tool: str, expected: int, env: Mapping[str, str], limit_s: float) -> list[str]:
    deadline = time.monotonic() + limit_s
    hint = (
        f"the recipe needs {expected} GPU(s) on this node (check the amdgpu driver and that the container "
        "is given /dev/kfd and /dev/dri; `amd-smi list` on the node shows the same error)"
    )
    try:
        list_out, _ = _run_tool([tool, "list", "--json"], deadline - time.monotonic(), env, limit_s)
        gpus = _entries(_json_from(list_out))
    except _ToolFailed as e:
        return [f"{e}; {hint}"]
    except ValueError as e:
        return [f"could not read `amd-smi list --json` ({e}); {hint}"]
    problems: list[str] = []
    if len(gpus) < expected:
        problems.append(
            f"{len(gpus)} GPU(s) visible, the recipe needs {expected} on this node "
            "(the container or the Slurm allocation does not expose them all: check --gres / the container's "
            "/dev/dri devices)"
        )
    try:
        proc_out, tool_pid = _run_tool([tool, "process", "--json"], deadline - time.monotonic(), env, limit_s)
    except _ToolFailed as e:
        return [*problems, f"{e}; cannot tell whether the GPUs are free"]
    try:
        entries = _entries(_json_from(proc_out))
    except ValueError as e:
        if "no running process" in proc_out.lower():
            return problems
        return [*problems, f"could not read `amd-smi process --json` ({e}); cannot tell whether the GPUs are free"]
    for n, entry in enumerate(entries):
        holders = _amd_holders(entry, tool_pid)
        if holders:
            gpu = entry.get("gpu", n)
            problems.append(f"GPU {gpu} is busy: {_busy_text(holders)} {_BUSY_HINT}")
    return problems


def check_gpus(
    expected: int, vendor: str = "auto", env: Mapping[str, str] | None = None, timeout_s: float = 10
) -> list[str]:
    """The node has at least `expected` GPUs and none of them holds another process's memory.
    The whole node is checked (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES are ignored): the job owns it."""
    if expected <= 0:
        return []
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath)
    nvidia_smi = shutil.which("nvidia-smi", path=path)
    amd_smi = shutil.which("amd-smi", path=path)
    if vendor == "auto":
        if nvidia_smi:
            return _nvidia(nvidia_smi, expected, env, timeout_s)
        if amd_smi:
            return _amd(amd_smi, expected, env, timeout_s)
        return [f"no GPU tool (nvidia-smi or amd-smi) on PATH; the recipe needs {expected} GPU(s) on this node"]
    if vendor == "nvidia":
        if nvidia_smi:
            return _nvidia(nvidia_smi, expected, env, timeout_s)
        return [f"nvidia-smi is not on PATH; the recipe needs {expected} NVIDIA GPU(s) on this node"]
    if vendor == "amd":
        if amd_smi:
            return _amd(amd_smi, expected, env, timeout_s)
        return [f"amd-smi is not on PATH; the recipe needs {expected} AMD GPU(s) on this node"]
    return [f"unknown GPU vendor {vendor!r} (expected auto, nvidia or amd)"]


# --------------------------------------------------------------------------- weights


def _missing_dir(d: Path, what: str) -> str:
    parent = d.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if d.is_symlink():
        return f"{what} {d} is a symlink to a missing target ({os.readlink(d)})"
    return (
        f"{what} {d} does not exist on this node ({parent} does); download the model there, "
        "or check the path and that its storage is mounted into the container"
    )


def _unreadable(p: Path) -> str | None:
    """Why `p` cannot be read, or None. A dangling symlink (an HF cache snapshot whose blob
    is missing) is the commonest case after permissions."""
    if p.is_symlink() and not p.exists():
        return f"{p.name} (a symlink to a missing file: an incomplete download?)"
    if not os.access(p, os.R_OK):
        return f"{p.name} (not readable by {_uid()})"
    return None


def _is_lfs_pointer(p: Path) -> bool:
    try:
        if p.stat().st_size > 1024:
            return False
        with p.open("rb") as f:
            return f.read(64).startswith(b"version https://git-lfs")
    except OSError:
        return False


def _check_model_dir(d: Path, need_weights: bool) -> list[str]:
    if not d.exists():
        return [_missing_dir(d, "model directory")]
    if not d.is_dir():
        return [f"model path {d} is not a directory (vLLM needs the model's directory, with config.json)"]
    if not os.access(d, os.R_OK | os.X_OK):
        mode = stat.filemode(d.stat().st_mode)
        return [
            f"model directory {d} cannot be read by {_uid()} ({mode}, owner uid {d.stat().st_uid}); fix its permissions"
        ]
    config = d / "config.json"
    if not config.exists() and not config.is_symlink():
        return [f"{d} has no config.json (is it the model's top directory? a Hugging Face model has config.json there)"]
    bad = _unreadable(config)
    if bad:
        return [f"{d}: cannot read {bad}"]
    try:
        json.loads(config.read_text())
    except OSError as e:
        return [f"{d}: cannot read config.json ({e.strerror or e})"]
    except ValueError:
        return [f"{config} is not valid JSON (a truncated download?)"]
    if not need_weights:
        return []
    try:
        weights = sorted(
            {p for pat in WEIGHT_PATTERNS for p in d.glob(pat) if p.name not in NOT_WEIGHTS and not p.is_dir()}
        )
    except OSError as e:
        return [f"{d}: cannot list the weight files ({e.strerror or e})"]
    if not weights:
        return [
            f"{d} has config.json but no weight files ({', '.join(WEIGHT_PATTERNS)}); download the weights, "
            "or run with --load-format dummy (random weights) if that is what the benchmark wants"
        ]
    problems: list[str] = []
    unreadable = [why for why in (_unreadable(p) for p in weights) if why]
    if unreadable:
        problems.append(f"{d}: {len(unreadable)} weight file(s) cannot be read: {_few(unreadable)}")
    pointers = [p.name for p in weights if p.exists() and _is_lfs_pointer(p)]
    if pointers:
        problems.append(
            f"{d}: {_few(pointers)} {'is a Git LFS pointer' if len(pointers) == 1 else 'are Git LFS pointers'}, "
            "not weights (run `git lfs pull` in the model directory, or download it with huggingface-cli)"
        )
    for index_name in WEIGHT_INDEXES:
        index = d / index_name
        if not index.is_file():
            continue
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            problems.append(f"{index} cannot be read as a weight index (a truncated download?)")
            continue
        missing = [s for s in shards if not (d / s).exists()]
        if missing:
            problems.append(
                f"{d}: {len(missing)} of the {len(shards)} weight shards listed in {index_name} are missing "
                f"({_few(missing)}): an incomplete download"
            )
    return problems


def _hf_snapshot(cache: Path, hf_id: str) -> tuple[Path | None, str]:
    """The snapshot vLLM would load offline, or (None, why not)."""
    repo_dir = f"models--{hf_id.replace('/', '--')}"
    snapshots = cache / repo_dir / "snapshots"
    ref = cache / repo_dir / "refs" / "main"
    if ref.is_file():
        try:
            rev = ref.read_text().strip()
        except OSError as e:
            return None, f"cannot read {ref} ({e.strerror or e})"
        if (snapshots / rev / "config.json").exists():
            return snapshots / rev, ""
        return None, f"{repo_dir}/refs/main names revision {rev}, but {repo_dir}/snapshots/{rev}/config.json is missing"
    try:
        found = [s for s in snapshots.iterdir() if (s / "config.json").exists()]
    except OSError:
        found = []
    if found:
        return max(found, key=lambda s: (s / "config.json").lstat().st_mtime), ""
    return None, f"no {repo_dir}/snapshots/*/config.json"


def check_weights(
    path: str | None, *, hf_id: str | None = None, hf_cache: str | None = None, need_weights: bool = True
) -> list[str]:
    """The model the servers load is on this node and readable: a local directory (`path`), or
    `hf_id` in the Hugging Face hub cache `hf_cache` (the job runs with HF_HUB_OFFLINE=1, so
    nothing is downloaded). need_weights False (--load-format dummy) needs config.json only."""
    if path:
        return _check_model_dir(Path(path), need_weights)
    if not hf_id or not hf_cache:
        return []  # nothing local to check: the model would come from the hub
    cache = Path(hf_cache)
    if not cache.is_dir():
        return [_missing_dir(cache, "Hugging Face cache")]
    snapshot, why = _hf_snapshot(cache, hf_id)
    if snapshot is None:
        return [
            f"{hf_id} is not in the Hugging Face cache {cache} ({why}); HF_HUB_OFFLINE=1 is set, so vLLM would not "
            f"download it: download it first (HF_HUB_CACHE={cache} huggingface-cli download {hf_id})"
        ]
    return [f"{hf_id} in the Hugging Face cache: {p}" for p in _check_model_dir(snapshot, need_weights)]


# --------------------------------------------------------------------------- disk, memory


def check_disk(path: str, need_bytes: int) -> list[str]:
    """At least `need_bytes` free on the filesystem holding `path` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError as e:
        return [f"cannot read the free space of {path} ({e.strerror or e})"]
    if free < need_bytes:
        return [
            f"only {_fmt_bytes(free)} free on the filesystem of {path}, {_fmt_bytes(need_bytes)} needed "
            "(logs and results go there and would be lost when it fills); free space or use another results directory"
        ]
    return []


def _read_int(p: Path) -> int | None:
    try:
        text = p.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else _int(text)


def _inactive_file(stat_file: Path, key: str) -> int:
    try:
        for line in stat_file.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_headroom(cgroup_root: Path, proc_cgroup: Path) -> tuple[int, int, int, Path] | None:
    """(headroom, limit, usage, cgroup dir) of the tightest memory limit over this process's
    cgroup and its ancestors (v2 and v1), or None when there is no limit. Reclaimable page
    cache (inactive_file) does not count as used."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, int, int, Path] | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            root = cgroup_root if (cgroup_root / "cgroup.controllers").exists() else cgroup_root / "unified"
            limit_f, usage_f, inactive_key = "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            root = cgroup_root / "memory"
            limit_f, usage_f, inactive_key = "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
        else:
            continue
        leaf = root / rel.lstrip("/")
        d = leaf if leaf.is_dir() else root  # inside a container the cgroup is often mounted at the root
        while True:
            limit = _read_int(d / limit_f)
            usage = _read_int(d / usage_f)
            if limit is not None and limit < _UNLIMITED and usage is not None:
                used = max(0, usage - _inactive_file(d / "memory.stat", inactive_key))
                room = limit - used
                if best is None or room < best[0]:
                    best = (room, limit, used, d)
            if d == root or d == d.parent:
                break
            d = d.parent
    return best


def check_memory(
    need_bytes: int,
    meminfo: Path = Path("/proc/meminfo"),
    *,
    cgroup_root: Path | None = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> list[str]:
    """At least `need_bytes` of host memory available: MemAvailable, and the job's cgroup
    memory limit (Slurm's --mem), which the kernel enforces with the OOM killer."""
    if need_bytes <= 0:
        return []
    problems: list[str] = []
    try:
        m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo.read_text(), re.MULTILINE)
    except OSError as e:
        return [f"cannot read {meminfo} ({e.strerror or e}) to check the {_fmt_bytes(need_bytes)} the servers need"]
    if m is None:
        problems.append(f"no MemAvailable in {meminfo}; cannot check the {_fmt_bytes(need_bytes)} the servers need")
    elif int(m.group(1)) * 1024 < need_bytes:
        problems.append(
            f"only {_fmt_bytes(int(m.group(1)) * 1024)} of host memory is available (MemAvailable), the servers "
            f"on this node need {_fmt_bytes(need_bytes)}; stop leftover processes on the node or lower the "
            "servers' CPU memory (e.g. VLLM_CPU_KVCACHE_SPACE)"
        )
    if cgroup_root is not None:
        found = _cgroup_headroom(cgroup_root, proc_cgroup)
        if found is not None and found[0] < need_bytes:
            room, limit, used, where = found
            problems.append(
                f"this job's memory limit leaves {_fmt_bytes(max(room, 0))} (cgroup {where}: limit "
                f"{_fmt_bytes(limit)}, {_fmt_bytes(used)} in use), the servers on this node need "
                f"{_fmt_bytes(need_bytes)} and would be OOM-killed; ask Slurm for more memory (--mem, or --mem=0 "
                "for the whole node's) or lower the servers' CPU memory"
            )
    return problems


# --------------------------------------------------------------------------- RDMA


def _no_runner(argv: Sequence[str], timeout: float) -> str:
    raise OSError("not run by the preflight")  # QoS is not checked here; nic.detect makes it a notice


def check_rdma(sysfs: Path = Path("/sys"), environ: Mapping[str, str] | None = None) -> list[str]:
    """The connector moves KV over RDMA: the node needs an RDMA device with an ACTIVE port
    (among IBDEVICES, when set)."""
    environ = os.environ if environ is None else environ
    present = nic.list_devices(sysfs)
    if not present:
        return [
            f"no RDMA device under {sysfs / 'class' / 'infiniband'}; the connector needs RDMA "
            "(set topology.nic_detection=false to use TCP)"
        ]
    try:
        result = nic.detect(sysfs, environ, runner=_no_runner)
    except nic.NicError as e:
        return [f"{e} (set IBDEVICES to devices of this node, or unset it to use every active one)"]
    if result.transport == "rdma":
        return []
    states = []
    for name in present:
        dev = nic.read_device(sysfs, name)
        states += [f"{name} port {p.port} is {p.state}" for p in dev.ports] or [f"{name} has no ports"]
    return [
        f"no RDMA port is ACTIVE ({', '.join(states)}); the connector needs RDMA: check the links "
        "(ibstat / ibv_devinfo: cable, switch port, subnet manager), or set topology.nic_detection=false to use TCP"
    ]


# --------------------------------------------------------------------------- clock


def check_clock(shared_dir: Path, max_skew_s: float = 1.0) -> list[str]:
    """This node's clock agrees with the shared filesystem's (the file server stamps the mtime
    of a file written to the run directory): cross-node timings need clocks in sync."""
    shared_dir = Path(shared_dir)
    try:
        fd, name = tempfile.mkstemp(prefix=".clock-", dir=shared_dir)
    except OSError as e:
        return [
            f"cannot write to the shared run directory {shared_dir} ({e.strerror or e}); every node writes its "
            "state there: is it mounted read-write on this node?"
        ]
    try:
        before = _now()
        with os.fdopen(fd, "wb") as f:
            f.write(b"clock\n")
            f.flush()
            os.fsync(f.fileno())
        after = _now()
        mtime = os.stat(name).st_mtime
    except OSError as e:
        return [f"cannot write to the shared run directory {shared_dir} ({e.strerror or e})"]
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass
    if mtime < before - max_skew_s:
        skew, how = before - mtime, "ahead of"
    elif mtime > after + max_skew_s:
        skew, how = mtime - after, "behind"
    else:
        return []
    return [
        f"this node's clock is {skew:.1f} s off the shared filesystem's ({how} it); run chrony/NTP on the nodes "
        "(cross-node timings such as the TTFT breakdown would be wrong)"
    ]


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Problem:
    node: int
    check: str  # "ports", "gpus", "weights", "disk", "memory", "rdma", "clock", "image", ...
    cause: str

    def __str__(self) -> str:
        return f"node {self.node}: {self.cause}"


def _as_causes(result: object) -> Iterable[str]:
    if isinstance(result, str):
        return [result]
    return [str(r) for r in (result or [])]  # type: ignore[attr-defined]


def run_checks(node: int, checks: dict[str, Callable[[], list[str]]], timeout_s: float = 20) -> list[Problem]:
    """Run the checks concurrently, each in a daemon thread bounded by `timeout_s` (a check
    still running then is a problem, and its thread is abandoned); an exception is a problem
    naming its check. Problems come back in the order of `checks`."""
    results: dict[str, list[Problem]] = {}

    def run(name: str, check: Callable[[], list[str]]) -> None:
        try:
            results[name] = [Problem(node, name, cause) for cause in _as_causes(check())]
        except Exception as e:  # any failure of a check is reported, not raised
            results[name] = [Problem(node, name, f"check {name} failed: {type(e).__name__}: {e}")]

    threads = {
        name: threading.Thread(target=run, args=(name, check), name=f"preflight-{name}", daemon=True)
        for name, check in checks.items()
    }
    deadline = time.monotonic() + timeout_s
    for t in threads.values():
        t.start()
    problems: list[Problem] = []
    for name, t in threads.items():
        t.join(max(0.0, deadline - time.monotonic()))
        if name in results:
            problems += results[name]
        else:
            problems.append(
                Problem(
                    node,
                    name,
                    f"check {name} did not finish within {timeout_s:g} s (a hung mount, GPU driver or tool?)",
                )
            )
    return problems
