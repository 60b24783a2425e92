"""pip's configured package sources as uv arguments, one per line, for scripts/setup.sh.

setup.sh installs with uv (seconds where pip takes minutes), but uv reads none of pip's
configuration: a machine that points pip at a mirror, a folder of wheels or a constraints file
(pip.conf, PIP_* variables) must install the same way through uv, or it would resolve against
other releases, or fail offline.
    pip_sources_for_uv.py [PYTHON]   PYTHON: the interpreter whose pip to ask (default: this one)
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip's option and uv's flag: the sources, not pip's behaviour (timeouts, certificates: uv reads
# SSL_CERT_FILE itself).
FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# `pip config list` prints the merged files (a later file already won) as `section.option`: the
# sections `pip install` reads, lowest precedence first (a PIP_* variable is ":env:").
SECTIONS = ("global", "install", ":env:")


def uv_args(config_list: str) -> list[str]:
    """uv's arguments for the output of `pip config list` (lines `section.option='value'`)."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in config_list.splitlines():
        name, sep, raw = line.partition("=")
        section, _, option = name.rpartition(".")
        if not sep or option not in FLAGS or section not in SECTIONS:
            continue
        rank = SECTIONS.index(section)
        if option not in chosen or rank >= chosen[option][0]:
            chosen[option] = (rank, ast.literal_eval(raw))
    args: list[str] = []
    for option, flag in FLAGS.items():
        if option in chosen:
            for value in chosen[option][1].split():  # pip splits these list options on whitespace
                args += [flag, value]
    return args


def main() -> int:
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    out = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    print("\n".join(uv_args(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
