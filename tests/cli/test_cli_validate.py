"""`pdbench validate` (and the commands that load a recipe) as a user runs them: values refused
before any run directory exists, errors that name the source of the bad value, "did you mean"."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.cli_run import pdbench

from harness.config.load import PROJECT_ROOT

LEAKS = ("Traceback", "Value error,", "ValidationError", "node=None")


def refused(*args: str) -> str:
    """stderr of a command that must exit 2 with one clean error."""
    r = pdbench(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("error: "), r.stderr
    assert not any(leak in r.stderr for leak in LEAKS), r.stderr
    return r.stderr


def test_set_takes_the_list_syntax_of_bench(tmp_path: Path) -> None:
    out = tmp_path / "job"
    r = pdbench(
        "render",
        "tiny-fp32-cpu-nixl-1p1d",
        "--out",
        str(out),
        "--skip-flag-check",
        "--set",
        "benchmark.concurrency=1,2,8",
    )
    assert r.returncode == 0, r.stderr
    lock = yaml.safe_load((out / "recipe.lock.yaml").read_text())
    assert lock["recipe"]["benchmark"]["concurrency"] == [1, 2, 8]
    # The same for the other comma-separated options of `pdbench bench`.
    r = pdbench(
        "validate",
        "tiny-fp32-cpu-nixl-1p1d",
        "--skip-flag-check",
        *("--set", "benchmark.isl=null", "--set", "benchmark.osl=null"),
        *("--set", "benchmark.shapes=128x64,256x32", "--set", "benchmark.percentiles=50,99"),
    )
    assert r.returncode == 0 and r.stdout.startswith("ok: tiny-fp32-cpu-nixl-1p1d"), r.stderr
    # A bad item is named like any other bad value.
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "benchmark.concurrency=1,x")
    assert err.startswith("error: --set benchmark.concurrency: benchmark.concurrency.1: Input should be"), err


def test_absurd_concurrency_is_refused_with_the_bound(tmp_path: Path) -> None:
    err = refused(
        "validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "benchmark.concurrency=[100000000000]"
    )
    assert "--set benchmark.concurrency: at most 100000 requests in flight per point (got 100000000000)" in err
    # Before any run directory exists.
    r = pdbench(
        "submit",
        *("-r", "tiny-fp32-cpu-nixl-1p1d", "--launcher", "local", "--dry-run", "--skip-flag-check"),
        *("--set", "benchmark.concurrency=[8,100000000000]", "--results-dir", str(tmp_path)),
    )
    assert r.returncode == 2 and "at most 100000 requests in flight" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_slurm_time_formats(tmp_path: Path) -> None:
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "slurm.time_limit=1h")
    assert err.startswith("error: --set slurm.time_limit: '1h' is not a Slurm time: MINUTES, MINUTES:SECONDS,"), err
    assert "DAYS-HOURS:MINUTES:SECONDS or UNLIMITED" in err
    for ok in ("90", "1:30:00", "2-12", "1-00:00:00", "UNLIMITED"):
        r = pdbench("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", f"slurm.time_limit='{ok}'")
        assert r.returncode == 0, (ok, r.stderr)
    # YAML reads 1:30:00 as 5400 (base 60): a number is refused rather than guessed at.
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "slurm.time_limit=1:30:00")
    assert "got the number 5400: write the time as a quoted string" in err, err
    # submit's --time is the same key: refused before a run directory exists.
    r = pdbench(
        "submit",
        "-r",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "--dry-run",
        "--skip-flag-check",
        "--time",
        "1h",
        "--results-dir",
        str(tmp_path),
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: --time: slurm.time_limit: '1h' is not a Slurm time: MINUTES,"), r.stderr
    assert list(tmp_path.iterdir()) == []
    # Any Slurm option is named as the option, and the lock file says where the value came from.
    r = pdbench(
        *("submit", "-r", "dsr1-fp8-mi355x-moriio-1p2d", "--dry-run", "--skip-flag-check", "--gpus-per-node", "4"),
        *("--results-dir", str(tmp_path)),
    )
    assert r.returncode == 2 and "topology.gpus_per_node is 4 (set by --gpus-per-node)" in r.stderr, r.stderr
    r = pdbench(
        *("submit", "-r", "tiny-fp32-cpu-nixl-1p1d", "--dry-run", "--skip-flag-check", "--time", "1:00:00"),
        *("--set", "slurm.partition=debug", "--results-dir", str(tmp_path)),
    )
    assert r.returncode == 0, r.stderr
    (lock,) = tmp_path.glob("tiny-fp32-cpu-nixl-1p1d/*/recipe.lock.yaml")
    sources = yaml.safe_load(lock.read_text())["sources"]
    assert sources["slurm.time_limit"] == "--time" and sources["slurm.partition"] == "--set", sources


def test_image_references_no_runtime_accepts() -> None:
    for bad in ("vllm openai:latest", "vllm/vllm-openai:v1:v2", "VLLM-OPENAI"):
        err = refused("validate", "dsr1-fp8-mi355x-moriio-1p2d", "--skip-flag-check", "--set", f"container.image={bad}")
        assert f"--set container.image: {bad!r} is not an image any container runtime accepts" in err, err
        assert "[REGISTRY/]NAME[:TAG][@DIGEST]" in err
    # (An NVIDIA recipe: an nvcr.io image under the MI355X one is refused as other hardware.)
    for ok in ("registry.example:5000/team/vllm:v1", "nvcr.io#nvidia/vllm:25.01", "/shared/images/vllm.sqsh"):
        r = pdbench("validate", "dsr1-fp8-h200-nixl-1p2d", "--skip-flag-check", "--set", f"container.image={ok}")
        assert r.returncode == 0, (ok, r.stderr)


def test_errors_blame_the_source_of_the_value(tmp_path: Path) -> None:
    # A topology clash made by --set names --set, not the recipe file.
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "proxy.port=8100")
    assert err.startswith("error: --set proxy.port: port 8100 of proxy is also used by prefill-0"), err
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "model=nope")
    assert err.startswith("error: --set model: 'nope' is not in"), err
    # A check across sections names the key it is about, not "(top level)" of the recipe file.
    err = refused("validate", "dsr1-fp8-mi355x-moriio-1p2d", "--skip-flag-check", "--set", "proxy.workers=2")
    assert (
        err.strip() == "error: --set proxy.workers: MoRI-IO keeps its registrations in one proxy process; it must be 1"
    )
    # The same clash written in a recipe file names that file and the key.
    recipe = yaml.safe_load((PROJECT_ROOT / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml").read_text())
    recipe["proxy"] = {"port": 8100}
    path = tmp_path / "clash.yaml"
    path.write_text(yaml.safe_dump(recipe))
    err = refused("validate", str(path), "--skip-flag-check")
    assert err.startswith(f"error: {path}: proxy.port: port 8100"), err


def test_did_you_mean(tmp_path: Path) -> None:
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1", "--skip-flag-check")
    assert "recipe not found (did you mean 'tiny-fp32-cpu-nixl-1p1d'?)" in err, err
    # Two recipes as near as each other: both are named, not the first one found.
    assert {"tiny-fp32-cpu-nixl-1p1d", "tiny-fp32-cpu-nixl-1p2d"} <= {
        p.stem for p in (PROJECT_ROOT / "recipes").glob("*.yaml")
    }
    err = refused("validate", "tiny-fp32-cpu-nixl-1p3d", "--skip-flag-check")
    assert "recipe not found (did you mean 'tiny-fp32-cpu-nixl-1p1d' or 'tiny-fp32-cpu-nixl-1p2d'?)" in err, err
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "benchmark.concurency=[1]")
    assert err.startswith("error: --set benchmark.concurency: unknown key (did you mean 'concurrency'?)"), err
    err = refused("validate", "tiny-fp32-cpu-nixl-1p2d", "--cluster", "locl", "--skip-flag-check")
    assert "cluster profile 'locl' not found (did you mean 'local'?)" in err, err
    recipe = yaml.safe_load((PROJECT_ROOT / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml").read_text())
    recipe["topology"]["prefill"]["wokers"] = recipe["topology"]["prefill"].pop("workers", 1)
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(recipe))
    err = refused("validate", str(path), "--skip-flag-check")
    assert err.startswith(f"error: {path}: topology.prefill.wokers: unknown key (did you mean 'workers'?)"), err
    # Nothing close: no guess.
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "benchmark.zzz=1")
    assert "unknown key" in err and "did you mean" not in err, err


def test_a_profile_that_changes_the_hardware_is_refused(tmp_path: Path) -> None:
    # The recipe is written for NVIDIA H200 (its image's GPUs, its description); the profile is an MI355X site's.
    err = refused("validate", "dsr1-fp8-h200-nixl-1p2d", "--cluster", "example-mi355x-mori", "--skip-flag-check")
    profile = PROJECT_ROOT / "clusters" / "example-mi355x-mori.yaml"
    assert err.startswith(f"error: {profile}: container.gpus: this cluster profile moves recipe"), err
    assert "to AMD GPUs (container.gpus amd, container.image registry.example.internal/vllm/vllm-openai-rocm" in err
    assert "slurm.partition mi355x), but the recipe is written for NVIDIA GPUs (container.gpus nvidia" in err
    # render refuses it too, before writing anything.
    out = tmp_path / "job"
    r = pdbench("render", "dsr1-fp8-h200-nixl-1p2d", "--cluster", "example-mi355x-mori", "--out", str(out))
    assert r.returncode == 2 and "moves recipe dsr1-fp8-h200-nixl-1p2d to AMD GPUs" in r.stderr, r.stderr
    assert not out.exists()
    # A CPU-only profile under a GPU recipe (TP8 on nodes without GPUs).
    err = refused("validate", "dsr1-fp8-h200-nixl-1p2d", "--cluster", "local", "--skip-flag-check")
    assert "local.yaml: topology.gpus_per_node: this cluster profile moves recipe dsr1-fp8-h200-nixl-1p2d to " in err
    assert "CPU-only nodes (topology.gpus_per_node 0)" in err and "NVIDIA GPUs" in err, err
    # The matching pairs pass the hardware check (the AMD recipe on the AMD profile validates).
    r = pdbench("validate", "dsr1-fp8-mi355x-moriio-1p2d", "--cluster", "example-mi355x-mori", "--skip-flag-check")
    assert "moves recipe" not in r.stderr, r.stderr


def test_a_set_value_that_changes_the_hardware_is_refused() -> None:
    # The H200 recipe validates as written (the precondition), and --set of a key that names no
    # hardware keeps it valid.
    for extra in ([], ["--set", "slurm.partition=batch"]):
        r = pdbench("validate", "dsr1-fp8-h200-nixl-1p2d", "--skip-flag-check", *extra)
        assert r.returncode == 0, r.stderr
    err = refused("validate", "dsr1-fp8-h200-nixl-1p2d", "--skip-flag-check", "--set", "container.image=rocm/vllm:1")
    assert err.startswith("error: --set container.image: moves recipe dsr1-fp8-h200-nixl-1p2d to AMD GPUs"), err
    assert "the recipe is written for NVIDIA GPUs (container.gpus nvidia" in err, err
    err = refused("validate", "dsr1-fp8-h200-nixl-1p2d", "--skip-flag-check", "--set", "slurm.partition=mi355x")
    assert err.startswith("error: --set slurm.partition: moves recipe dsr1-fp8-h200-nixl-1p2d to AMD GPUs"), err


def test_more_ranks_than_the_nodes_have(tmp_path: Path) -> None:
    # CPU-only nodes: one core group (cpu_bind) per rank of a worker.
    err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "topology.prefill.tp=4")
    assert "topology.prefill.cpu_bind: '0' gives 1 core group(s), but each worker has tp*dp = 4 rank(s)" in err, err
    r = pdbench(
        "validate",
        *("tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", "topology.prefill.tp=2"),
        *("--set", "topology.prefill.cpu_bind=['0|1']"),
    )
    assert r.returncode == 0, r.stderr
    # GPU nodes: a worker's tp*dp within the node's GPUs (the profile's count).
    err = refused("validate", "dsr1-fp8-mi355x-moriio-1p2d", "--skip-flag-check", "--set", "topology.gpus_per_node=4")
    assert "tp*dp 8 needs 8 GPUs, but topology.gpus_per_node is 4 (set by --set topology.gpus_per_node)" in err, err
    # A profile's GPU count under a TP8 recipe: both files named.
    profile = tmp_path / "four-gpus.yaml"
    profile.write_text("topology:\n  gpus_per_node: 4\n")
    err = refused("validate", "dsr1-fp8-h200-nixl-1p2d", "--cluster", str(profile), "--skip-flag-check")
    recipe = PROJECT_ROOT / "recipes" / "dsr1-fp8-h200-nixl-1p2d.yaml"
    assert err.startswith(f"error: {recipe}: topology.prefill: 1 worker(s) per node x tp*dp 8 needs 8 GPUs"), err
    assert f"but topology.gpus_per_node is 4 (set by {profile})" in err, err


def _profile_without_shared_install(tmp_path: Path) -> Path:
    """The H200 example profile without site.pdbench_root (a path this host does not have)."""
    data = yaml.safe_load((PROJECT_ROOT / "clusters" / "example-h200-nixl.yaml").read_text())
    del data["site"]["pdbench_root"]
    path = tmp_path / "h200.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_names_the_profile_the_launcher_and_what_submit_would_refuse(tmp_path: Path) -> None:
    # The function `pdbench validate` delegates to (its CLI test: tests/cli/test_cli_validate_launcher.py).
    from harness.submit.check import validate
    from harness.submit.refused import Refused

    profile = _profile_without_shared_install(tmp_path)
    out = validate("dsr1-fp8-h200-nixl-1p2d", [], str(profile), True, "slurm")
    lines = out.splitlines()
    assert lines[0].startswith("ok: dsr1-fp8-h200-nixl-1p2d (") and ", launcher slurm, " in lines[0], out
    assert lines[1] == f"cluster profile: {profile}, which sets:", out
    assert (
        "  container.image = registry.example.internal/vllm/vllm-openai:v0.32.0 (the recipe's: vllm/vllm-openai:v0.32.0)"
        in lines
    ), out
    assert "  slurm.partition = h200" in lines and "  site.hf_cache = /lustre/shared/hf-cache" in lines, out
    assert not any(line.startswith("note:") for line in lines), out  # weights from the shared HF cache
    # Without a profile: said, and the download every node would make is a note.
    out = validate("dsr1-fp8-mi355x-moriio-1p2d", [], None, True, "slurm")
    assert "cluster profile: none (--cluster or $PDBENCH_CLUSTER names one)" in out, out
    assert "note: every node would download deepseek-ai/DeepSeek-R1-0528 from the Hugging Face hub" in out, out
    # Dummy weights: only the config and the tokenizer come from the hub.
    dummy = ["topology.prefill.flags={load-format: dummy}", "topology.decode.flags={load-format: dummy}"]
    out = validate("dsr1-fp8-mi355x-moriio-1p2d", dummy, None, True, "slurm")
    assert "note: every node would download deepseek-ai/DeepSeek-R1-0528's config from the Hugging Face hub" in out
    # What submit would refuse, refused here too: ports that clash once every node runs on this host,
    # (a role's workers take consecutive ports on one host: decode-1 8201, prefill-1 8101)
    clash = ["topology.prefill.workers=2", "topology.prefill.nodes=2", "topology.decode.port=8101"]
    with pytest.raises(Refused, match="port 8101 of decode-0 is also used by prefill-1 on this host"):
        validate("tiny-fp32-cpu-nixl-1p2d", clash, "local", True, "local")
    assert validate("tiny-fp32-cpu-nixl-1p2d", [], "local", True, "local").startswith("ok: tiny-fp32-cpu-nixl-1p2d")
    assert validate("tiny-fp32-cpu-nixl-1p2d", [], "local", True, "slurm").startswith("ok: tiny-fp32-cpu-nixl-1p2d")
    # and a shared install the nodes would run from that is not there.
    with pytest.raises(Refused, match=r"site\.pdbench_root /lustre/shared/pdbench holds no pdbench checkout"):
        validate("dsr1-fp8-h200-nixl-1p2d", [], "example-h200-nixl", True, "slurm")


def test_bad_overrides_name_the_override_and_no_internals() -> None:
    cases = {
        "benchmark.isl": "error: --set benchmark.isl: expected KEY.PATH=VALUE, e.g. benchmark.isl=1024",
        ".a=1": "error: --set .a: expected a dotted key path such as benchmark.isl",
        "benchmark.isl.x=1": "error: --set benchmark.isl.x: benchmark.isl: holds a value, not keys below it",
        "benchmark=5": "error: --set benchmark: expected a mapping of keys (got 5)",
    }
    for override, expected in cases.items():
        err = refused("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check", "--set", override)
        assert err.strip() == expected, (override, err)
        assert "BenchmarkSettings" not in err
