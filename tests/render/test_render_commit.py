"""The commit a run records (recipe.lock.yaml's git_commit, the power package's producer commit):
git's HEAD in a checkout; in a tree shipped without its .git (scripts/device/snapshot.sh's
archive, which the GPU machines run), the commit the archive names in COMMIT_FILE."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.render.job import COMMIT_FILE, git_commit

ROOT = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"


def test_a_checkout_records_its_head() -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    assert head.returncode == 0, head.stderr  # the precondition: the tests run in a checkout
    assert git_commit(ROOT) == head.stdout.strip()


def test_a_tree_without_git_records_the_commit_its_archive_names(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None
    (tmp_path / COMMIT_FILE).write_text(SHA + "\n")
    assert git_commit(tmp_path) == SHA
    (tmp_path / COMMIT_FILE).write_text("not a commit\n")
    assert git_commit(tmp_path) is None


def test_the_device_snapshot_names_its_commit() -> None:
    text = (ROOT / "scripts" / "device" / "snapshot.sh").read_text()
    assert f'git rev-parse HEAD >"$tmp/{COMMIT_FILE}"' in text
