"""What used to fail only at run time, after servers started, is refused by `validate` and by
`submit --dry-run`, naming the key: cpu_bind's syntax and cores, a KV side-channel port on a
server's port, a prompt longer than the model takes, a relative mount source, an environment
value the kernel would not pass, local weights that are not there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from helpers.cli_run import pdbench

from harness.config.cpus import parse_cpus, parse_groups
from harness.config.load import PROJECT_ROOT

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
pytestmark = pytest.mark.timeout(240)
SERVER_PORT = yaml.safe_load((PROJECT_ROOT / "recipes" / f"{RECIPE}.yaml").read_text())["topology"]["prefill"]["port"]
NOT_HERE = max(os.sched_getaffinity(0)) + 1

CASES = {
    "cpu_bind syntax": (
        ['topology.prefill.cpu_bind=["0-x"]'],
        "topology.prefill.cpu_bind.0: '0-x' is not a core number or a range LOW-HIGH",
    ),
    "cpu_bind backwards": (['topology.decode.cpu_bind=["5-2"]'], "the range '5-2' runs backwards"),
    "cpu_bind beyond this host": (
        [f'topology.decode.cpu_bind=["{NOT_HERE}"]'],
        f"topology.decode.cpu_bind: '{NOT_HERE}' of decode-0 names core(s) {NOT_HERE}, which this host",
    ),
    "side channel on a server port": (
        [f"connector.side_channel_port={SERVER_PORT}"],
        f"connector.side_channel_port: port {SERVER_PORT} of prefill-0's KV side channel is also used by prefill-0",
    ),
    "isl beyond max_model_len": (
        ["benchmark.isl=5000", "benchmark.osl=32"],
        "benchmark.isl: a request may need 5032 tokens (isl 5000 + osl 32), more than model tiny-llama's "
        "max_model_len 4096",
    ),
    "relative mount source": (
        ['container.mounts={"data": "/data"}'],
        "container.mounts.data.[key]: 'data' is not an absolute path",
    ),
    "local weights missing": (
        ["model=deepseek-r1-0528-fp8", "site.model_root=/nonexistent/models"],
        "model directory /nonexistent/models/deepseek-ai/DeepSeek-R1-0528 does not exist",
    ),
}


def _refused(tmp_path: Path, recipe: str, sets: list[str]) -> list[str]:
    """validate's and submit --dry-run's stderr, each refused (exit 1 or 2) with no traceback."""
    argv = [a for s in sets for a in ("--set", s)]
    common = ["--launcher", "local", "--skip-flag-check", *argv]
    results = tmp_path / "results"
    errs = []
    for cmd in (["validate", recipe], ["submit", recipe, "--dry-run", "--results-dir", str(results)]):
        r = pdbench(*cmd, *common)
        assert r.returncode in (1, 2), (cmd, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
        errs.append(r.stderr)
    assert not results.exists() or not any(results.rglob("plan.json")), "a refused dry run made a run"
    return errs


def test_one_parser_reads_the_bind_syntax() -> None:
    # The parser the schema checks with, the node pins with and the search counts cores with.
    assert parse_cpus("0-3|6,8") == {0, 1, 2, 3, 6, 8} and parse_cpus("1") == {1}
    assert parse_groups("0-1|2-3") == [{0, 1}, {2, 3}]
    for bad in ("", "0||1", "a", "3-1", "0-", "-1", "0-3;4"):
        with pytest.raises(ValueError):
            parse_cpus(bad)


def test_the_base_recipe_passes() -> None:
    # Precondition of every case below: only the one value makes the recipe wrong.
    r = pdbench("validate", RECIPE, "--launcher", "local", "--skip-flag-check")
    assert r.returncode == 0 and r.stdout.startswith(f"ok: {RECIPE}"), r.stdout + r.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_anything_runs(tmp_path: Path, case: str) -> None:
    sets, said = CASES[case]
    for err in _refused(tmp_path, RECIPE, sets):
        assert said in err, err


def test_an_env_value_the_kernel_would_not_pass(tmp_path: Path) -> None:
    recipe = yaml.safe_load((PROJECT_ROOT / "recipes" / f"{RECIPE}.yaml").read_text())
    recipe["name"] = "big-env"
    recipe.setdefault("env", {})["BIG"] = "x" * 140_000  # over Linux's MAX_ARG_STRLEN (128 KiB)
    path = tmp_path / "big-env.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for err in _refused(tmp_path, str(path), []):
        assert err.startswith(f"error: {path}: env: BIG: its value is 140000 bytes; the kernel takes at most"), err
    recipe["env"]["BIG"] = "x" * 100_000  # under it: accepted
    path.write_text(yaml.safe_dump(recipe))
    r = pdbench("validate", str(path), "--launcher", "local", "--skip-flag-check")
    assert r.returncode == 0, r.stderr
