"""harness.render.vllm_flags: rendered `vllm serve` lines through the installed vLLM's parser.

Importing vLLM and building its parser costs seconds; the module builds it once per
process, so the vLLM tests below share one build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import require_vllm

from harness.render import vllm_flags
from harness.render.vllm_flags import FlagProblem, check_many, check_serve_args, image_version_note

BASE = ["/models/x", "--port", "8100", "--max-model-len", "4096", "--tensor-parallel-size", "1", "--enforce-eager"]
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
VALID = [*BASE, "--kv-transfer-config", NIXL]


@pytest.fixture(scope="module")
def vllm():
    """vLLM is required where CI says so (conftest.require_vllm); the parser is built once."""
    require_vllm()
    import vllm

    return vllm


# --- no vLLM needed ---------------------------------------------------------------------


def test_flag_problem_str_omits_missing_parts():
    assert str(FlagProblem("--x", "engine.x", "bad")) == "engine.x: --x: bad"
    assert str(FlagProblem("--x", None, "bad")) == "--x: bad"
    assert str(FlagProblem(None, None, "bad")) == "bad"


@pytest.mark.parametrize(
    ("image", "installed", "differs"),
    [
        ("vllm/vllm-openai-rocm:v0.32.0", "0.32.0+cpu", False),  # local suffix ignored
        ("vllm/vllm-openai:v0.11.0", "0.32.0+cpu", True),
        ("x:v0.11.0-rocm", "0.32.0", True),
        ("registry.example:5000/vllm/vllm-openai:v0.32.1", "0.32.0", True),  # the port is no version
        ("vllm/vllm-openai:nightly", "0.32.0", False),  # unknown
        ("vllm/vllm-openai", "0.32.0", False),  # no tag
        ("vllm/vllm-openai:v0.11.0", None, False),  # vLLM not installed
        (None, "0.32.0", False),
    ],
)
def test_image_version_note(image, installed, differs):
    note = image_version_note(image, installed)
    assert (note is not None) == differs
    if differs:
        assert "\n" not in note and image in note and "0.32" in note


def test_import_is_lazy_and_missing_vllm_raises_vllm_unavailable():
    # A fresh interpreter where `import vllm` fails, as on a machine without vLLM.
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "from harness.render import vllm_flags as v\n"
        "assert not any(m.startswith('vllm.') for m in sys.modules), 'vllm imported eagerly'\n"
        "try:\n"
        "    v.check_serve_args(['/models/x'])\n"
        "except v.VllmUnavailable as e:\n"
        "    print('unavailable:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unavailable: vLLM cannot be imported")


def test_check_many_cache_skips_commands_that_passed(tmp_path, monkeypatch):
    calls = []

    def fake_check(args, origins=None):
        calls.append(args)
        return [FlagProblem("--bad", None, "no")] if "--bad" in args else []

    monkeypatch.setattr(vllm_flags, "check_serve_args", fake_check)
    monkeypatch.setattr(vllm_flags, "vllm_version", lambda: "0.32.0+cpu")
    cache = tmp_path / "cache" / "flags"  # made on first use
    decode = ["/models/x", "--port", "8200"]
    commands = [VALID, decode, VALID]

    assert check_many(commands, cache_dir=cache) == []
    assert calls == [VALID, decode]  # the duplicate is checked once
    assert len(list(cache.iterdir())) == 2  # one entry per command

    assert check_many(commands, cache_dir=cache) == []
    assert len(calls) == 2  # cached: nothing checked again

    # Another job sharing one serve line checks only its new one.
    other = ["/models/x", "--port", "8300"]
    assert check_many([decode, other], cache_dir=cache) == []
    assert calls[2:] == [other]

    monkeypatch.setattr(vllm_flags, "vllm_version", lambda: "0.33.0")
    assert check_many(commands, cache_dir=cache) == []
    assert calls[3:] == [VALID, decode]  # another vLLM version checks again

    bad = [*VALID, "--bad"]
    assert check_many([bad, VALID], cache_dir=cache) and check_many([bad], cache_dir=cache)
    assert calls[5:] == [bad, bad]  # a failing command is never cached; its passing neighbour stays
    assert len(list(cache.iterdir())) == 5
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp file left


# --- the installed vLLM -----------------------------------------------------------------


def test_valid_command_passes_silently(vllm, capfd):
    assert check_serve_args(VALID) == []
    assert capfd.readouterr().err == ""


def test_misspelt_flag_names_flag_and_origin(vllm, capfd):
    origins = {"--max-num-seqz": "engine.max_num_seqz", "--port": "ports.http"}
    problems = check_serve_args([*VALID, "--max-num-seqz", "8", "--bogus_flag=1"], origins)
    assert problems == [
        FlagProblem("--max-num-seqz", "engine.max_num_seqz", "unrecognized arguments: --max-num-seqz"),
        FlagProblem("--bogus-flag", None, "unrecognized arguments: --bogus-flag=1"),
    ]
    assert str(problems[0]) == "engine.max_num_seqz: --max-num-seqz: unrecognized arguments: --max-num-seqz"
    assert capfd.readouterr().err == ""  # argparse's usage/error text is captured, not printed


def test_wrong_type_names_flag(vllm):
    [problem] = check_serve_args([*BASE, "--max-num-seqs", "abc"], {"--max-num-seqs": "engine.max_num_seqs"})
    assert (problem.flag, problem.origin) == ("--max-num-seqs", "engine.max_num_seqs")
    assert "invalid int value: 'abc'" in problem.message


def test_malformed_json_names_flag_on_one_line(vllm):
    origins = {"--kv-transfer-config": "connector"}
    [problem] = check_serve_args([*BASE, "--kv-transfer-config", '{"kv_connector": "NixlConnector",'], origins)
    assert (problem.flag, problem.origin) == ("--kv-transfer-config", "connector")
    assert "Invalid JSON" in problem.message and "\n" not in problem.message


def test_missing_kv_role_is_vllms_own_check(vllm):
    [problem] = check_serve_args([*BASE, "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'])
    assert problem.flag == "--kv-transfer-config"
    assert "Please specify kv_role" in problem.message


@pytest.mark.parametrize(
    "words",
    [
        ["--compilation-config", '{"no_such_key": 1}'],
        ["-cc", '{"no_such_key": 1}'],
        ["--compilation-config.no_such_key", "1"],  # dotted keys are merged into the JSON
    ],
)
def test_unknown_compilation_config_key(vllm, words):
    [problem] = check_serve_args([*BASE, *words])
    assert problem.flag == "--compilation-config"
    assert "no_such_key: Unexpected keyword argument" in problem.message
    assert "\n" not in problem.message


def test_unknown_connector(vllm):
    kv = '{"kv_connector": "NixelConnector", "kv_role": "kv_consumer"}'
    [problem] = check_serve_args([*BASE, "--kv-transfer-config", kv], {"--kv-transfer-config": "connector.name"})
    assert (problem.flag, problem.origin) == ("--kv-transfer-config", "connector.name")
    assert problem.message.startswith("unknown connector 'NixelConnector' (vLLM knows: ")
    assert "NixlConnector" in problem.message


def test_connector_module_path(vllm):
    kv = {"kv_connector": "PdbenchConnector", "kv_role": "kv_both", "kv_connector_module_path": "connector"}
    assert check_serve_args([*BASE, "--kv-transfer-config", json.dumps(kv)]) == []
    kv["kv_connector_module_path"] = "no_such_pkg.connector"
    [problem] = check_serve_args([*BASE, "--kv-transfer-config", json.dumps(kv)])
    assert "'no_such_pkg.connector' is not importable" in problem.message


def test_serve_validation_error_is_a_problem(vllm):
    [problem] = check_serve_args([*BASE, "--enable-auto-tool-choice"])
    assert problem.flag is None and "requires --tool-call-parser" in problem.message


def test_check_many_real_vllm_dedupes_problems_and_caches_passes(vllm, tmp_path, monkeypatch):
    prefill = [*VALID, "--max-num-seqz", "8"]
    decode = [*VALID, "--max-num-seqz", "8", "--port", "8200"]
    origins = {"--max-num-seqz": "engine.max_num_seqz"}
    problems = check_many([prefill, decode], [origins, origins], cache_dir=tmp_path)
    assert problems == [FlagProblem("--max-num-seqz", "engine.max_num_seqz", "unrecognized arguments: --max-num-seqz")]
    assert list(tmp_path.iterdir()) == []  # failures are not cached

    assert check_many([VALID, VALID], cache_dir=tmp_path) == []

    def must_not_parse(args):
        raise AssertionError("re-parsed a cached command")

    monkeypatch.setattr(vllm_flags, "_namespace", must_not_parse)
    assert check_many([VALID], cache_dir=tmp_path) == []


# --- the CLI: render/validate/submit refuse what vLLM would refuse at start-up -----------


class _Ran(NamedTuple):
    returncode: int
    stderr: str


def _cli(*args: str) -> _Ran:
    """The CLI in this process, whose vLLM parser (the `vllm` fixture's) is built once: a
    subprocess per command would import vLLM again each time (~20 s of CPU). `pdbench` as a
    program, with its exit codes, is what tests/cli/test_cli_validate.py runs."""
    from typer.testing import CliRunner

    from harness.cli import app

    r = CliRunner().invoke(app, list(args))
    return _Ran(r.exit_code, r.stderr)


def test_every_shipped_recipe_passes_vllms_parser(vllm, tmp_path: Path) -> None:
    from harness.config import load_recipe
    from harness.config.load import PROJECT_ROOT
    from harness.render.commands import serve_lines
    from harness.topology import plan

    for path in sorted((PROJECT_ROOT / "recipes").glob("*.yaml")):
        for cluster in (None, "local") if path.stem == "tiny-fp32-cpu-nixl-1p2d" else (None,):
            if path.stem == "tiny-fp32-cpu-nixl-1p2d" and cluster is None:
                continue  # needs its cluster's profile (no GPUs)
            rr = load_recipe(path.stem, cluster=cluster)
            lines = serve_lines(rr, plan(rr))
            problems = check_many([a for _, a, _ in lines], [o for _, _, o in lines])
            assert problems == [], f"{path.name}: {[str(p) for p in problems]}"
    for recipe, cluster in (
        ("dsr1-fp8-mi355x-moriio-1p2d", "example-mi355x-mori"),
        ("dsr1-fp8-mi355x-nixl-1p2d", "example-h200-nixl"),
    ):
        rr = load_recipe(recipe, cluster=cluster)
        lines = serve_lines(rr, plan(rr))
        assert check_many([a for _, a, _ in lines], [o for _, _, o in lines]) == []


def test_render_names_the_recipe_key_of_a_misspelt_flag_or_bad_json(vllm, tmp_path: Path) -> None:
    r = _cli(
        "render",
        "tiny-fp32-cpu-nixl-1p1d",
        "--out",
        str(tmp_path / "a"),
        "--set",
        "topology.decode.flags={max-num-seqz: 4}",
    )
    assert r.returncode == 2, r.stderr
    assert (
        "vLLM rejects a flag: --set topology.decode.flags.max-num-seqz: --max-num-seqz: unrecognized arguments"
        in r.stderr
    ), r.stderr
    assert not (tmp_path / "a" / "job.slurm").exists()
    # A catalogue flag that does not parse names models.yaml's entry.
    r = _cli(
        "render",
        "tiny-fp32-cpu-nixl-1p1d",
        "--out",
        str(tmp_path / "b"),
        "--set",
        "topology.prefill.flags={max-num-seqs: many}",
    )
    assert r.returncode == 2 and "topology.prefill.flags.max-num-seqs: --max-num-seqs: " in r.stderr, r.stderr
    r = _cli(
        "render",
        "tiny-fp32-cpu-nixl-1p1d",
        "--out",
        str(tmp_path / "c"),
        "--set",
        'topology.decode.flags={compilation-config: {"cudagraph_mode": "FULL", "bogus": 1}}',
    )
    assert r.returncode == 2 and "--compilation-config" in r.stderr and "bogus" in r.stderr, r.stderr
    # The recipe's NIXL-only settings go with NIXL: its extra_config and its progress thread off.
    mooncake = ("--set", "connector.name=mooncake", "--set", "connector.extra_config={}")
    r = _cli("validate", "tiny-fp32-cpu-nixl-1p1d", *mooncake)
    assert r.returncode == 2 and "connector.progress_thread: false applies to nixl, nixlpush only" in r.stderr
    r = _cli("validate", "tiny-fp32-cpu-nixl-1p1d", *mooncake, "--set", "connector.progress_thread=true")
    assert r.returncode == 0, r.stderr  # MooncakeConnector is one vLLM knows
    r = _cli(
        "render",
        "tiny-fp32-cpu-nixl-1p1d",
        "--out",
        str(tmp_path / "d"),
        "--skip-flag-check",
        "--set",
        "topology.decode.flags={max-num-seqz: 4}",
    )
    assert r.returncode == 0, r.stderr
