"""One command line, one style (issue 30): the recipe named one way or the other, -h and
--version, metavars that say what to give, one style of default, an example in every
command's help that the command accepts, "did you mean" for misspelt commands and options.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from harness import __version__
from harness.cli import app

ROOT = Path(__file__).resolve().parent.parent
CLI = typer.main.get_command(app)
COMMANDS = sorted(CLI.commands.items())
RECIPE_COMMANDS = ("render", "validate", "submit", "doctor")
# A Python type where a metavar should name what to give: <str>, <int>, list[str], {recipe}.
PYTHON_TYPE = re.compile(r"<(str|int|float|bool|path)>|list\[|\{[a-z_]+\}")


def pdbench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "100"})


def test_short_help_and_version_as_a_user_types_them():
    long_ = pdbench("--help")
    short = pdbench("-h")
    assert long_.returncode == short.returncode == 0, short.stderr
    assert short.stdout == long_.stdout and "Commands:" in short.stdout
    version = pdbench("--version")
    assert version.returncode == 0 and version.stdout.strip() == __version__
    sub = pdbench("submit", "-h")
    assert sub.returncode == 0 and "Usage:" in sub.stdout and "--launcher" in sub.stdout


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_help_names_what_to_give_never_a_python_type(name, cmd):
    result = invoke(name, "-h")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output  # precondition: this is the help text
    assert not PYTHON_TYPE.findall(result.output), result.output


WITH_OPTIONS = [(n, c) for n, c in COMMANDS if any(p.param_type_name == "option" for p in c.params)]


@pytest.mark.parametrize(("name", "cmd"), WITH_OPTIONS, ids=[n for n, _ in WITH_OPTIONS])
def test_defaults_are_written_one_way(name, cmd):
    text = invoke(name, "-h").output
    options = text.split("Options:", 1)[1]
    assert "[default" in options or "required" in options  # precondition: defaults are shown
    flat = " ".join(options.split())
    # Once, at the end of the help, one space before it; a flag's default is on or off.
    assert not re.search(r"\S {2,}\[(default|required)", " ".join(line.strip() for line in options.splitlines()))
    assert "[default: no-" not in flat and "/ --no-dry-run" not in flat


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_shows_an_example_it_accepts(name, cmd):
    text = invoke(name, "-h").output
    assert "Example:" in text, text
    examples = [
        shlex.split(line.replace("\\\n", " "))
        for line in re.split(r"\n(?=  +pdbench )", text.split("Example:", 1)[1].replace("\\\n", " "))
        if line.strip().startswith("pdbench")
    ]
    assert examples, text
    for words in examples:
        assert words[:2] == ["pdbench", name], words
        # Parsing only: the options exist, their values convert, nothing required is missing.
        with cmd.make_context(f"pdbench {name}", words[2:]) as ctx:
            assert ctx.command is cmd


@pytest.mark.parametrize("command", RECIPE_COMMANDS)
def test_the_recipe_is_named_as_an_argument_or_with_recipe(command):
    usage = invoke(command, "-h").output
    assert f"{command} [OPTIONS] [RECIPE]" in usage and "-r, --recipe RECIPE" in usage
    out = ["--out", "/nonexistent"] if command == "render" else []
    neither = invoke(command, *out)
    assert neither.exit_code == 2
    assert "name a recipe: RECIPE or --recipe RECIPE" in neither.output
    both = invoke(command, "local-tiny-1p1d", "--recipe", "local-tiny-1p2d", *out)
    assert both.exit_code == 2 and "two recipes named" in both.output


def test_validate_and_render_take_the_recipe_either_way(tmp_path):
    by_arg = pdbench("validate", "local-tiny-1p1d", "--skip-flag-check")
    by_opt = pdbench("validate", "--recipe", "local-tiny-1p1d", "--skip-flag-check")
    assert by_arg.returncode == 0, by_arg.stderr
    assert by_arg.stdout == by_opt.stdout and "ok: local-tiny-1p1d" in by_arg.stdout
    a, b = tmp_path / "a", tmp_path / "b"
    assert pdbench("render", "local-tiny-1p1d", "--out", str(a), "--skip-flag-check").returncode == 0
    assert pdbench("render", "-r", "local-tiny-1p1d", "--out", str(b), "--skip-flag-check").returncode == 0
    assert (a / "job.slurm").is_file()
    assert (a / "job.slurm").read_text().replace(str(a), "OUT") == (b / "job.slurm").read_text().replace(str(b), "OUT")


def test_submit_takes_the_recipe_as_an_argument(tmp_path):
    done = pdbench(
        "submit",
        "local-tiny-1p1d",
        "--launcher",
        "local",
        "--dry-run",
        "--skip-flag-check",
        "--results-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    runs = list((tmp_path / "local-tiny-1p1d").iterdir())
    assert len(runs) == 1 and (runs[0] / "server.sh").is_file()


def test_misspelt_commands_and_options_get_a_suggestion():
    command = pdbench("sumbit")
    assert command.returncode == 2 and "Did you mean 'submit'?" in command.stderr
    option = pdbench("submit", "--recipee", "local-tiny-1p1d")
    assert option.returncode == 2 and "--recipe" in option.stderr.split("No such option", 1)[1]
