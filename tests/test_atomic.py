"""harness.atomic: readers see the old file or the whole new one, never a part; no temp file stays."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from harness import atomic


def test_replace_and_exclusive(tmp_path: Path) -> None:
    p = tmp_path / "status.json"
    atomic.write_json(p, {"a": 1})
    atomic.write_json(p, {"a": 2}, indent=2)
    assert json.loads(p.read_text()) == {"a": 2} and stat.S_IMODE(p.stat().st_mode) == 0o644
    with pytest.raises(FileExistsError):
        atomic.write_text(p, "never", replace=False)
    assert json.loads(p.read_text()) == {"a": 2}
    atomic.write_text(tmp_path / "server.sh", "#!/bin/bash\n", replace=False, mode=0o755)
    assert stat.S_IMODE((tmp_path / "server.sh").stat().st_mode) == 0o755
    assert sorted(x.name for x in tmp_path.iterdir()) == ["server.sh", "status.json"]


def test_failure_mid_write_keeps_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "plot.png"
    atomic.write_bytes(p, b"old")

    def half(f) -> None:
        f.write(b"new, half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic.write_with(p, half)
    assert p.read_bytes() == b"old" and [x.name for x in tmp_path.iterdir()] == ["plot.png"]
