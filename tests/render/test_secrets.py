"""A token reaches the servers of a job without being written anywhere: a recipe's `secrets:`
names variables that the job takes from the submitting environment at run time, by name. The
value is in no rendered file, no recipe.lock.yaml and no log; a secret-looking key in `env:`
(written in clear into server.sh and the lock) is refused, and so is a submit without the secret."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
from conftest import port_base
from helpers.cli_run import pdbench

LOCAL = "tiny-fp32-cpu-nixl-1p1d"
TOKEN = "hf_pdbenchTestSecret0123456789"  # what a user's HF_TOKEN would hold
pytestmark = pytest.mark.timeout(240)


def _submit(tmp_path: Path, env: dict[str, str], *extra: str):
    """`submit --launcher local` of the local recipe with `secrets: [HF_TOKEN]`; its `vllm` is a
    stand-in that writes the HF_TOKEN it was started with beside the results, then fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    seen = tmp_path / "seen"
    seen.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "vllm").write_text(
        f'#!/usr/bin/env bash\nprintf %s "${{HF_TOKEN-unset}}" > {shlex.quote(str(seen))}/"$$"\nexit 1\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    base = port_base(23700)
    sets = [
        'secrets=["HF_TOKEN"]',
        f"topology.prefill.port={base}",
        f"topology.decode.port={base + 10}",
        f"connector.side_channel_port={base + 20}",
        f"proxy.port={base + 30}",
        "timeouts.health_s=60",
        "timeouts.teardown_s=5",
    ]
    argv = ["submit", LOCAL, "--launcher", "local", "--skip-flag-check", "--results-dir", str(tmp_path / "results")]
    argv += [a for s in sets for a in ("--set", s)]
    r = pdbench(*argv, *extra, env=dict(env, PDBENCH_PYTHON=str(bin_dir / "python")), timeout=180)
    return r, [p.read_text() for p in seen.iterdir()]


def _files_holding(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_a_secret_reaches_the_servers_and_no_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"} | {"HF_TOKEN": TOKEN}
    r, seen = _submit(tmp_path, env)
    assert r.returncode == 1, r.stdout + r.stderr  # the stand-in servers fail, after starting
    # The servers started (the job stops at the first one's failure) had the submitter's token.
    assert seen and set(seen) == {TOKEN}, seen
    (run,) = (tmp_path / "results" / LOCAL).iterdir()
    # The run's scripts, lock, logs and status name the secret, never its value; nor does the output.
    assert (run / "recipe.lock.yaml").read_text().count("HF_TOKEN") >= 1
    assert list((run / "logs").iterdir()), "the job wrote its logs"
    assert _files_holding(run, TOKEN) == []
    assert TOKEN not in r.stdout + r.stderr


def test_a_submit_without_the_secret_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    r, seen = _submit(tmp_path, env)
    assert r.returncode == 2 and seen == [], r.stdout + r.stderr
    assert "secrets: HF_TOKEN not set in this environment" in r.stderr and "export them" in r.stderr, r.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("plan.json"))
    # A dry run only says so: nothing would start.
    r, _ = _submit(tmp_path, env, "--dry-run")
    assert r.returncode == 0 and "note: secrets: HF_TOKEN not set" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD"])
def test_a_secret_in_env_is_refused(name: str) -> None:
    r = pdbench("validate", LOCAL, "--launcher", "local", "--skip-flag-check", "--set", f'env={{"{name}": "v"}}')
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"env: {name}: looks like a secret" in r.stderr and f"`secrets: [{name}]`" in r.stderr, r.stderr
    # Ordinary names pass.
    r = pdbench("validate", LOCAL, "--launcher", "local", "--skip-flag-check", "--set", 'env={"TOKENIZERS_X": "1"}')
    assert r.returncode == 0, r.stderr
