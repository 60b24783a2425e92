"""One tokenizer cache for the suite's real jobs.

A job's client builds its tokenizer with transformers the first time a results root sees it
(importing transformers' auto classes: about 10 s of CPU on this machine, while the job's
servers wait) and caches it in the results root (`.cache/tokenizers/`, keyed by the
tokenizer's files and transformers' version, harness.bench.tokenizer). Every test has a
results root of its own, so every job paid that again. `seed(results)` gives a results root
the entries the suite's earlier jobs built, before its job runs; what a job builds is taken
from the roots seeded before, at the next call. The first job of each tokenizer still builds
it, and harness.bench.tokenizer's own tests cover both paths.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_ENTRIES = Path(".cache") / "tokenizers"  # under a results root: where render/job.py points the client
_shared: Path | None = None
_seeded: list[Path] = []


def _store() -> Path:
    global _shared
    if _shared is None:
        _shared = Path(tempfile.mkdtemp(prefix="pdbench-test-tokenizers-"))
        atexit.register(shutil.rmtree, _shared, True)
    return _shared


def _copy_new(src: Path, dst: Path) -> None:
    if not src.is_dir():
        return
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.json"):
        if not (dst / f.name).exists():
            shutil.copyfile(f, dst / f.name)


def seed(results: Path) -> None:
    """Copy the tokenizers earlier jobs built into `results` (a job's --results-dir)."""
    store = _store()
    for root in _seeded:
        _copy_new(root / _ENTRIES, store)
    _copy_new(store, results / _ENTRIES)
    _seeded.append(results)
