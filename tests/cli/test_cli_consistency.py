"""One command line, one style (issue 30): the recipe named one way or the other, -h and
--version, metavars that say what to give, one style of default, an example in every
command's help that the command accepts, "did you mean" for misspelt commands and options.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from helpers.cli_run import pdbench
from typer.testing import CliRunner

from harness import __version__
from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]
CLI = typer.main.get_command(app)
COMMANDS = sorted(CLI.commands.items())
RECIPE_COMMANDS = ("render", "validate", "submit", "doctor")
# A Python type where a metavar should name what to give: <str>, <int>, list[str], {recipe}.
PYTHON_TYPE = re.compile(r"<(str|int|float|bool|path)>|list\[|\{[a-z_]+\}")


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
    both = invoke(command, "tiny-fp32-cpu-nixl-1p1d", "--recipe", "tiny-fp32-cpu-nixl-1p2d", *out)
    assert both.exit_code == 2 and "two recipes named" in both.output


def test_validate_and_render_take_the_recipe_either_way(tmp_path):
    by_arg = pdbench("validate", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check")
    by_opt = pdbench("validate", "--recipe", "tiny-fp32-cpu-nixl-1p1d", "--skip-flag-check")
    assert by_arg.returncode == 0, by_arg.stderr
    assert by_arg.stdout == by_opt.stdout and "ok: tiny-fp32-cpu-nixl-1p1d" in by_arg.stdout
    a, b = tmp_path / "a", tmp_path / "b"
    assert pdbench("render", "tiny-fp32-cpu-nixl-1p1d", "--out", str(a), "--skip-flag-check").returncode == 0
    assert pdbench("render", "-r", "tiny-fp32-cpu-nixl-1p1d", "--out", str(b), "--skip-flag-check").returncode == 0
    assert (a / "job.slurm").is_file()
    assert (a / "job.slurm").read_text().replace(str(a), "OUT") == (b / "job.slurm").read_text().replace(str(b), "OUT")


def test_submit_takes_the_recipe_as_an_argument(tmp_path):
    done = pdbench(
        "submit",
        "tiny-fp32-cpu-nixl-1p1d",
        "--launcher",
        "local",
        "--dry-run",
        "--skip-flag-check",
        "--results-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    runs = list((tmp_path / "tiny-fp32-cpu-nixl-1p1d").iterdir())
    assert len(runs) == 1 and (runs[0] / "server.sh").is_file()


def test_misspelt_commands_and_options_get_a_suggestion():
    command = pdbench("sumbit")
    assert command.returncode == 2 and "Did you mean 'submit'?" in command.stderr
    option = pdbench("submit", "--recipee", "tiny-fp32-cpu-nixl-1p1d")
    assert option.returncode == 2 and "--recipe" in option.stderr.split("No such option", 1)[1]


def _on_a_terminal(args: list[str], columns: int) -> str:
    """pdbench's output on a pseudo-terminal of `columns` columns."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args], cwd=ROOT, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(60) == 0
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_recipes_lists_every_recipe_and_profile():
    shipped = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    profiles = sorted(p.stem for p in (ROOT / "clusters").glob("*.yaml"))
    assert "tiny-fp32-cpu-nixl-1p1d" in shipped and "local" in profiles  # precondition: there is something to list
    listed = pdbench("recipes", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert [r["name"] for r in data["recipes"]] == shipped
    assert {p["name"] for p in data["cluster_profiles"]} >= set(profiles)
    tiny = next(r for r in data["recipes"] if r["name"] == "tiny-fp32-cpu-nixl-1p1d")
    assert tiny["model"] == "tiny-llama" and tiny["description"].startswith("tiny Llama")
    # Piped: one line per entry (for grep); on an 80-column terminal: wrapped, nothing cut.
    piped = pdbench("recipes").stdout
    assert all(any(line.split()[:1] == [name] for line in piped.splitlines()) for name in shipped + profiles)
    shown = _on_a_terminal(["recipes"], 80)
    assert max(len(line) for line in shown.splitlines()) <= 80, shown
    assert " ".join(shown.split()).count("tiny Llama, 1P1D on CPU, NixlConnector (kv_buffer_device=cpu)") == 1


def test_one_name_per_concept():
    names = {name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} for name, cmd in COMMANDS}
    # Where results go is --results-dir; the proxy's timings directory is --timings-dir on both sides.
    assert {n for n, opts in names.items() if "--results-dir" in opts} >= {"bench", "submit", "status", "report"}
    assert {n for n, opts in names.items() if "--timings-dir" in opts} == {"bench", "proxy"}
    assert not [n for n, opts in names.items() if opts & {"--result-dir", "--proxy-timings-dir"}]
    # The job's rendered script calls the client by the same name.
    assert '--results-dir "${RUN_DIR}"' in (ROOT / "tests/golden/tiny-fp32-cpu-nixl-1p1d/server.sh").read_text()
