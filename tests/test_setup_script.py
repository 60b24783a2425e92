"""scripts/setup.sh installs with uv, which reads none of pip's configuration:
scripts/pip_sources_for_uv.py hands it pip's sources (mirrors, wheel folders, constraints), the
ones a real pip reports from its config files and PIP_* variables, with pip's precedence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "pip_sources_for_uv.py"


def _uv_args(tmp_path: Path, config: str, **env: str) -> list[str]:
    conf = tmp_path / "pip.conf"
    conf.write_text(config)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # This machine's pip files out of the way (its XDG and user ones; /etc/pip.conf names a
    # certificate only), the test's file in (PIP_CONFIG_FILE, read last).
    isolated = {"HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    run_env = clean | isolated | {"PIP_CONFIG_FILE": str(conf), **env}
    r = subprocess.run([sys.executable, str(SCRIPT)], env=run_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_pips_sources_become_uvs_flags(tmp_path: Path) -> None:
    config = (
        "[global]\nfind-links = /opt/wheels\n"
        "extra-index-url = file:///opt/pypi/simple\n    file:///opt/more/simple\n"
        "constraint = /etc/c.txt\ntimeout = 180\n"
    )
    args = _uv_args(tmp_path, config)
    # Each value its own flag (pip splits these options on whitespace), nothing of pip's behaviour.
    assert args == [
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/more/simple",
        "--find-links", "/opt/wheels", "--constraint", "/etc/c.txt",
    ]  # fmt: skip


def test_an_environment_variable_wins_over_the_file(tmp_path: Path) -> None:
    args = _uv_args(tmp_path, "[global]\nfind-links = /from/file\n", PIP_FIND_LINKS="/from/env")
    # Precondition: the file alone gives its value.
    assert _uv_args(tmp_path, "[global]\nfind-links = /from/file\n") == ["--find-links", "/from/file"]
    assert args == ["--find-links", "/from/env"]


def test_install_section_wins_over_global(tmp_path: Path) -> None:
    config = (
        "[global]\nindex-url = https://a/simple\n[install]\nindex-url = https://b/simple\n[list]\nfind-links = /x\n"
    )
    assert _uv_args(tmp_path, config) == ["--index-url", "https://b/simple"]


def test_no_configuration_gives_no_flags(tmp_path: Path) -> None:
    assert _uv_args(tmp_path, "") == []
