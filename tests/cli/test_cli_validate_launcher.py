"""`pdbench validate --launcher` as a user runs it: the checks of that launcher, the cluster
profile and what it set, and the notes (needs part E's cli.py change: validate --launcher)."""

from __future__ import annotations

from pathlib import Path

import yaml
from helpers.cli_run import pdbench

from harness.config.load import PROJECT_ROOT


def test_validate_checks_for_the_launcher_given(tmp_path: Path) -> None:
    # Every node of tiny-fp32-cpu-nixl-1p2d on one host: a role's workers take consecutive ports there
    # (decode-1 8201), where Slurm nodes each give their first worker the role's port.
    ok = pdbench("validate", "tiny-fp32-cpu-nixl-1p2d", "--cluster", "local", "--skip-flag-check")
    assert ok.returncode == 0 and ", launcher slurm, " in ok.stdout, ok.stderr
    ok = pdbench(
        "validate", "tiny-fp32-cpu-nixl-1p2d", "--cluster", "local", "--launcher", "local", "--skip-flag-check"
    )
    assert ok.returncode == 0 and ", launcher local, " in ok.stdout, ok.stderr
    # A real clash on one host: prefill-1 takes 8101, which decode's first worker is given.
    clash = [
        "--set",
        "topology.prefill.workers=2",
        "--set",
        "topology.prefill.nodes=2",
        "--set",
        "topology.decode.port=8101",
    ]
    r = pdbench(
        "validate", "tiny-fp32-cpu-nixl-1p2d", "--cluster", "local", "--launcher", "local", "--skip-flag-check", *clash
    )
    assert r.returncode == 2, r.stdout
    assert "port 8101 of decode-0 is also used by prefill-1 on this host (the local launcher" in r.stderr, r.stderr
    # What submit --launcher local refuses the same way.
    r = pdbench(
        "submit",
        "-r",
        "tiny-fp32-cpu-nixl-1p2d",
        "--cluster",
        "local",
        "--launcher",
        "local",
        "--dry-run",
        "--results-dir",
        str(tmp_path),
        *clash,
    )
    assert not any(tmp_path.iterdir())
    assert r.returncode == 2 and "port 8101 of decode-0" in r.stderr, r.stderr


def test_validate_names_the_profile_and_what_it_set(tmp_path: Path) -> None:
    data = yaml.safe_load((PROJECT_ROOT / "clusters" / "example-h200-nixl.yaml").read_text())
    del data["site"]["pdbench_root"]  # a path on the example cluster's shared storage, not here
    profile = tmp_path / "h200.yaml"
    profile.write_text(yaml.safe_dump(data))
    r = pdbench("validate", "dsr1-fp8-h200-nixl-1p2d", "--cluster", str(profile), "--skip-flag-check")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == f"cluster profile: {profile}, which sets:", r.stdout
    assert (
        "  container.image = registry.example.internal/vllm/vllm-openai:v0.32.0 (the recipe's: vllm/vllm-openai:v0.32.0)"
        in lines
    ), r.stdout
    r = pdbench("validate", "dsr1-fp8-mi355x-moriio-1p2d", "--skip-flag-check")
    assert r.returncode == 0 and "cluster profile: none" in r.stdout, r.stderr
    assert "note: every node would download deepseek-ai/DeepSeek-R1-0528 from the Hugging Face hub" in r.stdout
