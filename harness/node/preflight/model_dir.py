"""One model directory is complete and readable: config.json, the weight files, the shards its index lists."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from harness.node.preflight.text import few, uid

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
# Files with a weights suffix that are not model weights (checkpoint leftovers).
NOT_WEIGHTS = frozenset({"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.pt"})
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def check_model_dir(d: Path, need_weights: bool) -> list[str]:
    """need_weights False (--load-format dummy) needs config.json only."""
    problem = _dir_problem(d) or _config_problem(d)
    if problem:
        return [problem]
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
    return _weight_file_problems(d, weights) + _index_problems(d)


def missing_dir(d: Path, what: str) -> str:
    parent = d.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if d.is_symlink():
        return f"{what} {d} is a symlink to a missing target ({os.readlink(d)})"
    return (
        f"{what} {d} does not exist on this node ({parent} does); download the model there, "
        "or check the path and that its storage is mounted into the container"
    )


def _dir_problem(d: Path) -> str | None:
    if not d.exists():
        return missing_dir(d, "model directory")
    if not d.is_dir():
        return f"model path {d} is not a directory (vLLM needs the model's directory, with config.json)"
    if not os.access(d, os.R_OK | os.X_OK):
        mode = stat.filemode(d.stat().st_mode)
        return (
            f"model directory {d} cannot be read by {uid()} ({mode}, owner uid {d.stat().st_uid}); fix its permissions"
        )
    return None


def _config_problem(d: Path) -> str | None:
    config = d / "config.json"
    if not config.exists() and not config.is_symlink():
        return f"{d} has no config.json (is it the model's top directory? a Hugging Face model has config.json there)"
    bad = _unreadable(config)
    if bad:
        return f"{d}: cannot read {bad}"
    try:
        json.loads(config.read_text())
    except OSError as e:
        return f"{d}: cannot read config.json ({e.strerror or e})"
    except ValueError:
        return f"{config} is not valid JSON (a truncated download?)"
    return None


def _weight_file_problems(d: Path, weights: list[Path]) -> list[str]:
    problems: list[str] = []
    unreadable = [why for why in (_unreadable(p) for p in weights) if why]
    if unreadable:
        problems.append(f"{d}: {len(unreadable)} weight file(s) cannot be read: {few(unreadable)}")
    pointers = [p.name for p in weights if p.exists() and _is_lfs_pointer(p)]
    if pointers:
        problems.append(
            f"{d}: {few(pointers)} {'is a Git LFS pointer' if len(pointers) == 1 else 'are Git LFS pointers'}, "
            "not weights (run `git lfs pull` in the model directory, or download it with huggingface-cli)"
        )
    return problems


def _index_problems(d: Path) -> list[str]:
    """Shards a weight index lists that are not there: an incomplete download."""
    problems: list[str] = []
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
                f"({few(missing)}): an incomplete download"
            )
    return problems


def _unreadable(p: Path) -> str | None:
    """Why `p` cannot be read, or None. A dangling symlink (an HF cache snapshot whose blob
    is missing) is the commonest case after permissions."""
    if p.is_symlink() and not p.exists():
        return f"{p.name} (a symlink to a missing file: an incomplete download?)"
    if not os.access(p, os.R_OK):
        return f"{p.name} (not readable by {uid()})"
    return None


def _is_lfs_pointer(p: Path) -> bool:
    try:
        if p.stat().st_size > 1024:
            return False
        with p.open("rb") as f:
            return f.read(64).startswith(b"version https://git-lfs")
    except OSError:
        return False
