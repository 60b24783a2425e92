"""The recipe-name grammar (harness/config/recipe_names.py, docs/recipes.md): every recipe in
recipes/ follows it truthfully, `pdbench validate` refuses a file in recipes/ that breaks it, and
an old name is told its new one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli_run import pdbench

from harness.config.load import PROJECT_ROOT, load_catalogue, load_recipe
from harness.config.recipe_names import GRAMMAR, facts_of, name_problem
from harness.config.renamed import RENAMED

USER_FACING = ("docs", "recipes", "scripts", "searches", "benchmarks", "clusters", "slurm_templates")
RECIPES = sorted(p.stem for p in (PROJECT_ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_is_named_by_the_grammar(name: str) -> None:
    assert name_problem(name, facts_of(load_recipe(name))) is None


def test_the_grammar_reads_what_the_file_says() -> None:
    """Each token is compared with the file: the same file under a name with one token wrong is
    refused at that token (so the check above is not satisfied by any name)."""
    facts = facts_of(load_recipe("llama8b-shape-bf16-h200x2-nixl-1p1d"))
    assert name_problem("llama8b-shape-bf16-h200x2-nixl-1p1d-b64", facts) is None
    wrong = {
        "llama8b-bf16-h200x2-nixl-1p1d": "model: expected 'llama8b-shape'",
        "llama8b-shape-fp8-h200x2-nixl-1p1d": "precision: 'fp8', but models.yaml gives 'llama-8b-shape' 'bf16'",
        "llama8b-shape-bf16-h200-nixl-1p1d": "hardware: 'h200' is 8 GPU(s) per node, but topology.gpus_per_node is 2",
        "llama8b-shape-bf16-h200x8-nixl-1p1d": "hardware: 'h200x8': x<N> is 1 to 7 GPUs of a node",
        "llama8b-shape-bf16-cpu-nixl-1p1d": "hardware: 'cpu' is 0 GPU(s) per node",
        "llama8b-shape-bf16-q100x2-nixl-1p1d": "hardware: 'q100x2' names no GPU known",
        "llama8b-shape-bf16-h200x2-pdbench-1p1d": "connector: 'pdbench', expected 'nixl'",
        "llama8b-shape-bf16-h200x2-nixl-1p2d": "topology: '1p2d', but the recipe has 1 prefill and 1 decode",
        "llama8b-shape-bf16-h200x2-nixl-agg": "topology: 'agg', but the recipe is not aggregated-only",
        "llama8b-shape-bf16-h200x2-nixl-pd": "topology: 'pd' is neither",
        "llama8b-shape-bf16-h200x2-nixl-1p1d-B64": "variant: 'B64'",
        "llama8b-shape-bf16-h200x2-nixl": "tokens: 'llama8b-shape-bf16-h200x2-nixl' has 4 of the 5 required",
    }
    for name, problem in wrong.items():
        assert (name_problem(name, facts) or "").startswith(problem), (name, name_problem(name, facts))
    agg = facts_of(load_recipe("llama8b-shape-bf16-h200x1-none-agg"))
    assert name_problem("llama8b-shape-bf16-h200x1-nixl-agg", agg) == (
        "connector: 'nixl', expected 'none' (an aggregated-only recipe runs no KV connector)"
    )
    rocm = facts_of(load_recipe("dsr1-fp8-mi355x-moriio-1p2d"))
    assert (name_problem("dsr1-fp8-h200-moriio-1p2d", rocm) or "").startswith(
        "hardware: 'h200' is NVIDIA GPUs, but container.image vllm/vllm-openai-rocm"
    )


def _project_copy(tmp: Path) -> Path:
    """The package, models.yaml and recipes/ in a directory of their own, so that a test can add
    a file to recipes/ without the other tests (which list recipes/) seeing it."""
    shutil.copytree(PROJECT_ROOT / "harness", tmp / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PROJECT_ROOT / "recipes", tmp / "recipes")
    shutil.copy(PROJECT_ROOT / "models.yaml", tmp / "models.yaml")
    return tmp


def _validate(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "validate", *args, "--skip-flag-check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )


def test_validate_refuses_a_new_recipe_whose_name_breaks_the_grammar(tmp_path: Path) -> None:
    root = _project_copy(tmp_path)
    source = root / "recipes" / "tiny-fp32-cpu-nixl-1p2d.yaml"
    # The precondition: this recipe passes validate under its own name in this copy.
    ok = _validate(root, "tiny-fp32-cpu-nixl-1p2d")
    assert ok.returncode == 0 and ok.stdout.startswith("ok: tiny-fp32-cpu-nixl-1p2d"), ok.stderr
    # A contributor adds it as a 1P1D recipe of the old style.
    shutil.copy(source, root / "recipes" / "local-tiny-1p1d-mine.yaml")
    shutil.copy(source, root / "recipes" / "tiny-fp32-cpu-nixl-1p1d-mine.yaml")
    for name, token in [
        ("local-tiny-1p1d-mine", "model: expected 'tiny' (the short_name of 'tiny-llama' in models.yaml) first"),
        (
            "tiny-fp32-cpu-nixl-1p1d-mine",
            "topology: '1p1d', but the recipe has 1 prefill and 2 decode worker(s) (1p2d)",
        ),
    ]:
        got = _validate(root, name)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 2 and len(lines) == 1, got.stderr
        path = root / "recipes" / f"{name}.yaml"
        assert lines[0] == (
            f"error: {path}: the file name breaks the recipe-name grammar: {token}; expected {GRAMMAR} (docs/recipes.md)"
        ), lines[0]
    # The same file kept outside recipes/ is a user's own, not the catalogue: not refused for its name.
    shutil.copy(source, tmp_path / "mine.yaml")
    assert _validate(root, str(tmp_path / "mine.yaml")).returncode == 0


def test_an_old_name_is_told_its_new_one() -> None:
    got = pdbench("validate", "local-tiny-1p2d-vs-aggregated", "--skip-flag-check")
    assert got.returncode == 2, got.stdout
    assert got.stderr.strip().endswith(
        "recipe 'local-tiny-1p2d-vs-aggregated' was renamed to 'tiny-fp32-cpu-nixl-1p2d-vs-agg' "
        "(docs/recipes.md, recipe names)"
    ), got.stderr


def test_renames_point_at_recipes_and_old_names_are_gone() -> None:
    assert set(RENAMED.values()) <= set(RECIPES)
    assert not set(RENAMED) & set(RECIPES)


def test_the_recipes_doc_states_the_grammar_and_every_model_token() -> None:
    doc = (PROJECT_ROOT / "docs" / "recipes.md").read_text()
    assert GRAMMAR in doc
    models = load_catalogue(PROJECT_ROOT / "models.yaml").models
    for key, model in models.items():
        assert model.short_name is not None, f"models.yaml: {key} has no short_name"
        assert f"`{model.short_name}`" in doc and f"`{key}`" in doc, (key, model.short_name)


def test_no_user_facing_file_uses_an_old_name() -> None:
    """Docs, scripts and configuration say the names that work; only the rename table and the
    recipes doc, which shows its error, keep the old."""
    old = re.compile(
        r"(?<![\w-])(" + "|".join(map(re.escape, sorted(RENAMED, key=len, reverse=True))) + r")(?![\w]|-\w)"
    )
    places = [PROJECT_ROOT / "README.md", *(PROJECT_ROOT / d for d in USER_FACING)]
    files = [p for place in places for p in ([place] if place.is_file() else sorted(place.rglob("*"))) if p.is_file()]
    assert len(files) > 20  # the places exist
    found = [
        f"{p.relative_to(PROJECT_ROOT)}: {m.group(1)}"
        for p in files
        if p != PROJECT_ROOT / "docs" / "recipes.md" and p.suffix in (".md", ".yaml", ".sh", ".py", ".txt")
        for m in old.finditer(p.read_text(errors="replace"))
    ]
    assert not found, found
