#!/usr/bin/env python3
"""The diff between two recipes' rendered server.sh, as docs/diffs/ keeps it for a scaled recipe
against the full one it was scaled from (docs/gpu.md, "Four H200s").

    .venv/bin/python scripts/render_diff.py FULL SCALED            # print the diff
    .venv/bin/python scripts/render_diff.py --write                # rewrite docs/diffs/*.diff

Both render with the golden tests' fixed context (run directory, root, commit), so the diff shows
what the recipes change and nothing of where or when they were rendered.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import load_recipe  # noqa: E402
from harness.render import RenderContext, render_job  # noqa: E402

CTX = RenderContext(
    run_dir="/shared/results/RUN", root="/opt/pdbench", python="/opt/pdbench/.venv/bin/python", git_commit="0123abcd"
)
DIFFS = ROOT / "docs" / "diffs"
# (full recipe, scaled recipe) -> docs/diffs/<scaled>.diff
PAIRS = [
    ("dsr1-fp8-h200-nixl-1p2d", "dsr1-shape-fp8-h200x4-nixl-1p2d"),
    ("dsr1-fp8-h200-nixl-1p1d-wideep", "dsr1-shape-fp8-h200x4-nixl-1p1d-wideep"),
]


def server_sh(recipe: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        render_job(load_recipe(recipe, []), Path(tmp), CTX)
        return (Path(tmp) / "server.sh").read_text().splitlines(keepends=True)


def diff(full: str, scaled: str) -> str:
    return "".join(
        difflib.unified_diff(server_sh(full), server_sh(scaled), f"{full}/server.sh", f"{scaled}/server.sh", n=1)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("recipes", nargs="*", metavar="RECIPE", help="FULL SCALED")
    parser.add_argument("--write", action="store_true", help="rewrite docs/diffs/ for every pair it keeps")
    args = parser.parse_args(argv)
    if args.write == bool(args.recipes) or (args.recipes and len(args.recipes) != 2):
        parser.error("give FULL SCALED, or --write alone")
    if args.recipes:
        sys.stdout.write(diff(*args.recipes))
        return 0
    DIFFS.mkdir(parents=True, exist_ok=True)
    for full, scaled in PAIRS:
        (DIFFS / f"{scaled}.diff").write_text(diff(full, scaled))
        print(f"wrote docs/diffs/{scaled}.diff")
    return 0


if __name__ == "__main__":
    sys.exit(main())
