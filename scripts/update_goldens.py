#!/usr/bin/env python3
"""Rewrite the golden files from what the code renders now; review `git diff tests/golden` after.

    .venv/bin/python scripts/update_goldens.py

The tests only compare: nothing in the suite or CI rewrites a golden file.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the test modules import their helpers as `helpers.*`

from scripts import render_diff  # noqa: E402
from tests.render import test_render  # noqa: E402
from tests.report import test_report  # noqa: E402


def main() -> int:
    written = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case, script in test_render.GOLDEN_CASES:
            text = (test_render.render_case(case, Path(tmp) / case / script) / script).read_text()
            path = test_render.GOLDEN / case / script
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written += 1
    for case in test_report.CASES:
        for fmt, output in test_report.FORMATS.items():
            path = test_report.GOLDEN / f"{case}.{fmt}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(output.render(test_report._report(case)))
            written += 1
    # docs/diffs/: scaled recipes' server.sh against the full ones', rendered as the goldens are.
    render_diff.main(["--write"])
    print(f"wrote {written} golden files; review them with: git diff --stat tests/golden docs/diffs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
