"""The CPU models' one-process engine (models.yaml: `distributed-executor-backend: uni`,
VLLM_ENABLE_V1_MULTIPROCESSING=0) against a server with more than one rank: rendered as `mp`
without the variable (harness.config.executor), and refused where the recipe asks for `uni` itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.cli_run import pdbench

from harness.config.executor import BACKEND_FLAG, ONE_PROCESS_ENV
from harness.config.load import PROJECT_ROOT, load_recipe
from harness.render.commands import server_argv, server_env
from harness.topology import plan

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
TWO_CORES = 'topology.prefill.cpu_bind=["0|1"]'  # a core group per rank


def _servers(*overrides: str) -> dict[str, tuple[str, str | None]]:
    """Worker -> (its rendered executor backend, its VLLM_ENABLE_V1_MULTIPROCESSING)."""
    rr = load_recipe(RECIPE, list(overrides), cluster="local")
    out = {}
    for w in plan(rr).workers:
        argv, env = server_argv(rr, w), server_env(rr, w)
        backend = argv[argv.index(f"--{BACKEND_FLAG}") + 1]
        assert isinstance(backend, str)
        value = env.get(ONE_PROCESS_ENV)
        out[w.name] = (backend, value if value is None else str(value))
    return out


def test_one_rank_servers_keep_the_catalogues_one_process_engine() -> None:
    # The precondition of the tests below: the catalogue asks for `uni` with the variable at "0".
    assert _servers() == {"prefill-0": ("uni", "0"), "decode-0": ("uni", "0")}


def test_more_than_one_rank_per_engine_renders_mp_without_the_variable() -> None:
    seen = _servers("topology.prefill.tp=2", TWO_CORES)
    assert seen == {"prefill-0": ("mp", None), "decode-0": ("uni", "0")}
    # Pipeline parallel (a flag: the plan's core groups count tp*dp only) counts as tensor parallel does.
    seen = _servers("topology.prefill.flags.pipeline-parallel-size=2")
    assert seen["prefill-0"] == ("mp", None)


def test_data_parallel_renders_mp_without_the_variable() -> None:
    seen = _servers("topology.prefill.dp=2", TWO_CORES)
    assert seen == {"prefill-0": ("mp", None), "decode-0": ("uni", "0")}


def test_a_recipe_that_sets_the_variable_keeps_it() -> None:
    # What the recipe states is rendered; only the catalogue's own value goes.
    seen = _servers("topology.prefill.tp=2", TWO_CORES, f'topology.prefill.env={{"{ONE_PROCESS_ENV}": "0"}}')
    assert seen["prefill-0"] == ("mp", "0")


def _recipe_asking_uni(tmp_path: Path, **role: object) -> Path:
    data = yaml.safe_load((PROJECT_ROOT / "recipes" / f"{RECIPE}.yaml").read_text())
    data["topology"]["prefill"].update(role, cpu_bind=["0|1"], flags={BACKEND_FLAG: "uni"})
    path = tmp_path / f"{RECIPE}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_recipe_asking_uni_for_several_ranks_is_refused(tmp_path: Path) -> None:
    key = f"topology.prefill.flags.{BACKEND_FLAG}"
    path = _recipe_asking_uni(tmp_path, tp=2)
    for command in (["validate", str(path)], ["submit", "-r", str(path), "--dry-run", "--results-dir", str(tmp_path)]):
        r = pdbench(*command, "--skip-flag-check")
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert r.stderr.startswith(
            f"error: {path}: {key}: 'uni' runs a server's engine in one process, but each prefill server has "
            "2 ranks per engine (tp x pp): vLLM needs 'mp' (a process per rank) there; set 'mp' or leave the "
            "flag out (a model's 'uni' then renders as 'mp')"
        ), r.stderr
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no run directory
    r = pdbench("validate", str(_recipe_asking_uni(tmp_path, dp=2)), "--skip-flag-check")
    assert r.returncode == 2 and "each prefill server has 2 data-parallel ranks (dp): " in r.stderr, r.stderr
    # One rank: `uni` is what the catalogue asks anyway.
    r = pdbench(
        "validate", str(_recipe_asking_uni(tmp_path)), "--skip-flag-check", "--set", "topology.prefill.cpu_bind=['0']"
    )
    assert r.returncode == 0, r.stderr


def test_the_connector_tests_servers_take_the_catalogues_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import devpair as dp

    started: list[tuple[list[str], dict[str, str]]] = []

    class Recorder:
        """Stands in for devpair's Supervisor: keeps the line and environment, starts nothing."""

        def __init__(self, log_dir: Path) -> None:
            pass

        def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
            started.append((list(argv), dict(env)))

    monkeypatch.setattr(dp, "Supervisor", Recorder)
    monkeypatch.delenv(ONE_PROCESS_ENV, raising=False)  # the servers' environment starts from this one
    model = str(PROJECT_ROOT / "models" / "pdbench-copy")
    dp.start_server("one", model, 0, "0", tmp_path)
    dp.start_server("two", model, 0, "0|1", tmp_path, tp=2)
    (one, one_env), (two, two_env) = started
    assert one[one.index(f"--{BACKEND_FLAG}") + 1] == "uni" and "--tensor-parallel-size" not in one, one
    assert (one_env[ONE_PROCESS_ENV], one_env["OMP_NUM_THREADS"], one_env["VLLM_CPU_KVCACHE_SPACE"]) == ("0", "1", "1")
    assert two[two.index(f"--{BACKEND_FLAG}") + 1] == "mp" and two[two.index("--tensor-parallel-size") + 1] == "2"
    assert ONE_PROCESS_ENV not in two_env and two_env["OMP_NUM_THREADS"] == "1", two_env
    with pytest.raises(ValueError, match=r"no model of .*models\.yaml has this path"):
        dp.start_server("other", str(tmp_path), 0, "0", tmp_path)
