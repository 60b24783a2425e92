"""Recipe and catalogue loading: every error names the file and key, and the CLI exits 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import ConfigError, load_recipe
from harness.config.load import PROJECT_ROOT
from harness.config.overrides import parse_override
from harness.topology import check_single_host, plan


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """A copy of the project's recipes and catalogue that tests may break."""
    shutil.copytree(PROJECT_ROOT / "recipes", tmp_path / "recipes")
    shutil.copy(PROJECT_ROOT / "models.yaml", tmp_path / "models.yaml")
    return tmp_path


def _error(root: Path, recipe: str = "tiny-fp32-cpu-nixl-1p1d", overrides: list[str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe, overrides or [], root=root)
    return e.value


def test_shipped_recipes_load() -> None:
    for name in ("tiny-fp32-cpu-nixl-1p1d", "dsr1-fp8-mi355x-moriio-1p2d", "dsr1-fp8-mi355x-nixl-1p2d"):
        rr = load_recipe(name)
        assert rr.name == name and len(rr.fingerprint) == 16
    rr = load_recipe("dsr1-fp8-mi355x-moriio-1p2d")
    assert rr.recipe.connector.name == "moriio" and rr.recipe.topology.decode.ep == 8
    assert load_recipe("dsr1-fp8-mi355x-nixl-1p2d").recipe.connector.name == "nixl"


def test_missing_recipe(root: Path) -> None:
    e = _error(root, "no-such-recipe")
    assert e.file.endswith("recipes/no-such-recipe.yaml") and "not found" in str(e)
    assert "tiny-fp32-cpu-nixl-1p1d" in str(e)  # lists what exists


def test_unknown_key(root: Path) -> None:
    p = root / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml"
    p.write_text(p.read_text().replace("  isl: 256", "  isl: 256\n  input_len: 12"))
    e = _error(root)
    assert e.file == str(p) and e.key == "benchmark.input_len" and "unknown key" in str(e)


def test_wrong_type(root: Path) -> None:
    p = root / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml"
    p.write_text(p.read_text().replace("concurrency: [1, 4]", "concurrency: [1, many]"))
    e = _error(root)
    assert e.key == "benchmark.concurrency.1" and "integer" in str(e) and "'many'" in str(e)


def test_model_not_in_catalogue(root: Path) -> None:
    p = root / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml"
    p.write_text(p.read_text().replace("model: tiny-llama", "model: llama-9000"))
    e = _error(root)
    assert e.file == str(p) and e.key == "model"
    assert "llama-9000" in str(e) and "models.yaml" in str(e) and "tiny-llama" in str(e)


def test_bad_catalogue_names_models_yaml(root: Path) -> None:
    m = root / "models.yaml"
    m.write_text(m.read_text().replace("    precision: fp32\n", "    precision: fp32\n    colour: red\n", 1))
    e = _error(root)
    assert e.file == str(m) and e.key == "models.tiny-llama.colour"


def test_invalid_yaml_names_line(root: Path) -> None:
    p = root / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml"
    p.write_text("model: [unclosed\n")
    e = _error(root)
    assert e.file == str(p) and "line" in str(e) and "invalid YAML" in str(e)


def test_overrides_typed_and_validated(root: Path) -> None:
    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d",
        ["benchmark.concurrency=[2, 8]", "benchmark.isl=1024", "topology.decode.flags.max-num-seqs=4"],
        root=root,
    )
    assert rr.recipe.benchmark.concurrency == [2, 8] and rr.recipe.benchmark.isl == 1024
    assert rr.recipe.topology.decode.flags == {"max-num-seqs": 4}
    assert _error(root, overrides=["benchmark.isl=-3"]).key == "benchmark.isl"
    assert _error(root, overrides=["benchmark.nope=1"]).key == "benchmark.nope"
    assert _error(root, overrides=["benchmark.isl.deeper=1"]).key == "benchmark.isl"
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")


def test_semantic_checks(root: Path) -> None:
    assert "dp_attention" in str(_error(root, overrides=["topology.decode.dp_attention=true"]))
    assert _error(root, overrides=["topology.decode.ep=3"]).key == "topology.decode"
    assert "image" in str(_error(root, overrides=["container.runtime=docker"]))


def test_topology_plan_and_port_conflicts(root: Path) -> None:
    p = plan(load_recipe("dsr1-fp8-mi355x-moriio-1p2d", root=root))
    assert p.num_nodes == 3
    assert [(w.name, w.node) for w in p.workers] == [("prefill-0", 0), ("decode-0", 1), ("decode-1", 2)]
    assert (p.devices("prefill"), p.devices("decode")) == (8, 16)
    rr = load_recipe("dsr1-fp8-mi355x-moriio-1p2d", root=root)
    with pytest.raises(ConfigError, match="local launcher"):
        check_single_host(rr, p)
    # Two TP4 workers share an 8-GPU node, each with its own devices and port.
    rr = load_recipe(
        "dsr1-fp8-mi355x-moriio-1p2d",
        ["topology.decode.nodes=1", "topology.decode.tp=4", "topology.decode.ep=4"],
        root=root,
    )
    d = plan(rr).role("decode")
    assert [(w.node, w.port, w.visible_devices) for w in d] == [(1, 2584, "0,1,2,3"), (1, 2585, "4,5,6,7")]
    with pytest.raises(ConfigError, match="gpus_per_node"):
        plan(
            load_recipe(
                "dsr1-fp8-mi355x-moriio-1p2d", ["topology.decode.nodes=1", "topology.decode.workers=4"], root=root
            )
        )
    with pytest.raises(ConfigError, match="must use all their GPUs"):
        plan(load_recipe("dsr1-fp8-mi355x-moriio-1p2d", ["topology.decode.workers=1"], root=root))
    # One decode worker over both decode nodes: DP16 attention with EP, TP1 per rank.
    p = plan(
        load_recipe(
            "dsr1-fp8-mi355x-moriio-1p2d",
            [
                "topology.decode.workers=1",
                "topology.decode.tp=1",
                "topology.decode.dp=16",
                "topology.decode.ep=16",
                "topology.decode.dp_attention=true",
            ],
            root=root,
        )
    )
    (d,) = p.role("decode")
    assert d.nodes == (1, 2) and d.span == "data_parallel" and d.devices == 16
    assert [(x.name, x.node, x.kind) for x in p.processes()] == [
        ("prefill-0", 0, "server"),
        ("decode-0", 1, "server"),
        ("decode-0-f1", 2, "follower"),
        ("proxy", 0, "proxy"),
    ]
    with pytest.raises(ConfigError, match=r"proxy\.port"):
        plan(load_recipe("tiny-fp32-cpu-nixl-1p1d", ["proxy.port=8100"], root=root))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--recipe", "no-such-recipe"], "no-such-recipe.yaml: recipe not found"),
        # A value given with --set is named as coming from `--set KEY`.
        (["--recipe", "tiny-fp32-cpu-nixl-1p1d", "--set", "benchmark.isl=abc"], "--set benchmark.isl: Input should"),
        (["--recipe", "tiny-fp32-cpu-nixl-1p1d", "--set", "benchmark.bogus=1"], "--set benchmark.bogus: unknown key"),
        (["--recipe", "tiny-fp32-cpu-nixl-1p1d", "--set", "model=nope"], "--set model: 'nope' is not in"),
    ],
)
def test_cli_exits_2_with_file_and_key(args: list[str], needle: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "harness", "submit", *args, "--dry-run", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert not any(tmp_path.iterdir())  # no run directory for a bad recipe


def test_dry_run_creates_run_dir_and_prints_sbatch(tmp_path: Path) -> None:
    # vLLM's flag check (an import of vLLM, ~20 s of CPU) is tests/render/test_vllm_flags.py's.
    args = [sys.executable, "-m", "harness", "submit", "--recipe", "dsr1-fp8-mi355x-moriio-1p2d", "--dry-run"]
    args += ["--skip-flag-check"]
    r = subprocess.run([*args, "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (run_dir,) = (tmp_path / "dsr1-fp8-mi355x-moriio-1p2d").iterdir()
    assert f"sbatch --parsable --chdir={run_dir} {run_dir}/job.slurm" in r.stdout
    assert {p.name for p in run_dir.iterdir()} >= {
        "job.slurm",
        "server.sh",
        "recipe.lock.yaml",
        "plan.json",
        "bench.json",
        "logs",
    }
    r2 = subprocess.run([*args, "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0 and len(list((tmp_path / "dsr1-fp8-mi355x-moriio-1p2d").iterdir())) == 2  # never reused


def test_recipe_name_is_a_safe_directory_name(root: Path) -> None:
    e = _error(root, overrides=["name=../../etc"])
    assert e.key == "name" and "safe name" in str(e)
    bad = root / "recipes" / "my recipe;x.yaml"
    shutil.copy(root / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml", bad)
    e = _error(root, str(bad))
    assert e.file == str(bad) and e.key == "name" and "set 'name:'" in str(e)
    assert load_recipe(str(bad), ["name=my-recipe"], root=root).name == "my-recipe"


@pytest.mark.parametrize(
    "override, key, needle",
    [
        ("env.A B=1", "env.A B.[key]", "environment variable name"),
        ('env.OK="a\\nb"', "env.OK", "control characters"),
        ('slurm.job_name="x\\ntouch M"', "slurm.job_name", "#SBATCH"),
        ('slurm.partition="a\\\\b"', "slurm.partition", "#SBATCH"),
        ('slurm.extra_sbatch=["--mem=0", "touch M"]', "slurm.extra_sbatch.1", "sbatch option"),
        ('container.mounts={"/a,/b": "/c"}', "container.mounts./a,/b.[key]", "','"),
        ('container.mounts={"/a": "/b,/c"}', "container.mounts./a", "','"),
        ('topology.decode.flags={"x; y": 1}', "topology.decode.flags.x; y.[key]", "flag name"),
        ('topology.decode.flags={"seed": "1\\u0000"}', "topology.decode.flags", "flag 'seed'"),
        ('description="two\\u0007lines"', "description", "control characters"),
    ],
)
def test_values_no_quoting_can_carry_are_refused_by_key(root: Path, override: str, key: str, needle: str) -> None:
    e = _error(root, overrides=[override])
    assert e.key == key and needle in str(e), str(e)


def test_multi_line_description_and_quoted_values_load(root: Path) -> None:
    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d",
        ['description="one\\ntwo"', 'slurm.job_name="a b $(c)"', 'container.mounts={"/data dir": "/data:ro"}'],
        root=root,
    )
    assert rr.recipe.description == "one\ntwo" and rr.recipe.slurm.job_name == "a b $(c)"


def test_recipe_sets_every_benchmark_setting(root: Path, tmp_path: Path) -> None:
    # The recipe's benchmark section is the same model `pdbench bench` reads: dataset,
    # goodput, burstiness, percentiles and the rest reach the job's bench.json unchanged.
    from harness.bench.client_config import ClientConfig
    from harness.render.commands import bench_config

    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d",
        [
            "benchmark.dataset=jsonl",
            f"benchmark.dataset_path={data}",
            "benchmark.goodput={ttft: 2000, tpot: 50}",
            "benchmark.burstiness=0.5",
            "benchmark.request_rate=8",
            "benchmark.percentiles=[50, 95]",
            "benchmark.total_timeout_s=900",
            "benchmark.validity.max_failed_share=0.1",
        ],
        root=root,
    )
    bench = ClientConfig.model_validate(bench_config(rr, plan(rr), {}))
    assert bench.dataset == "jsonl" and bench.dataset_path == str(data)
    assert bench.goodput == {"ttft": 2000.0, "tpot": 50.0} and bench.burstiness == 0.5
    assert bench.percentiles == [50.0, 95.0] and bench.total_timeout_s == 900
    assert bench.validity.max_failed_share == 0.1
    # Every setting the recipe holds is in bench.json, with the recipe's value.
    assert bench.model_dump(include=set(type(rr.recipe.benchmark).model_fields)) == rr.recipe.benchmark.model_dump()


@pytest.mark.parametrize(
    ("overrides", "key", "needle"),
    [
        (["benchmark.range_ratio_convention=vllm", "benchmark.range_ratio=1.0"], "benchmark", "[0, 1) for the vllm"),
        (["benchmark.goodput={queue: 5}"], "benchmark.goodput.queue.[key]", "'ttft', 'tpot' or 'e2el'"),
        (["benchmark.dataset=sharegpt"], "benchmark", "needs dataset_path"),
        (["benchmark.percentiles=[101]"], "benchmark.percentiles", "within [0, 100]"),
        (["benchmark.concurrency=[4, 4]"], "benchmark.concurrency", "unique"),
    ],
)
def test_benchmark_settings_checked_at_recipe_load(root: Path, overrides: list[str], key: str, needle: str) -> None:
    e = _error(root, overrides=overrides)
    # The override that gave the value is named: the last one written into the section.
    assert e.file.startswith(f"--set {overrides[-1].split('=')[0]}"), str(e)
    assert e.key == key and needle in str(e), str(e)


def test_validate_checks_without_rendering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from harness.cli import app

    monkeypatch.chdir(tmp_path)
    results = PROJECT_ROOT / "results"
    before = sorted(results.rglob("*")) if results.exists() else []
    ok = CliRunner().invoke(app, ["validate", "dsr1-fp8-mi355x-moriio-1p2d"])
    assert ok.exit_code == 0, ok.output
    assert (
        ok.output.startswith("ok: dsr1-fp8-mi355x-moriio-1p2d (")
        and "1P+2D on 3 node(s), connector moriio" in ok.output
    )
    bad = CliRunner().invoke(app, ["validate", "tiny-fp32-cpu-nixl-1p1d", "--set", "benchmark.percentiles=[90, 120]"])
    assert bad.exit_code == 2
    assert "--set benchmark.percentiles: " in bad.output and "within [0, 100]" in bad.output
    # The topology is checked too: the proxy on the prefill server's port.
    clash = CliRunner().invoke(app, ["validate", "tiny-fp32-cpu-nixl-1p1d", "--set", "proxy.port=8100"])
    assert clash.exit_code == 2 and "--set proxy.port: port 8100" in clash.output, clash.output
    # Nothing written: not here, not under the project's results/ (where submit writes).
    assert list(tmp_path.iterdir()) == []
    assert (sorted(results.rglob("*")) if results.exists() else []) == before


def test_pdbench_connector_keys_checked_at_load(root: Path) -> None:
    rr = load_recipe("tiny-fp32-cpu-pdbench-1p1d", ["connector.extra_config.io_timeout_s=30"], root=root)
    assert rr.recipe.connector.extra_config["io_timeout_s"] == 30
    e = _error(root, "tiny-fp32-cpu-pdbench-1p1d", ["connector.extra_config.kv_lease_duration=300"])
    assert e.key == "connector.extra_config" and "unknown key(s) for the pdbench connector: kv_lease_duration" in str(e)
    assert "accepted: host, port" in str(e)
