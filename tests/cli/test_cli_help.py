"""`pdbench ... --help` for every command, nested ones included (issue 11).

Every option has one line of help that states its default (or that it is required),
and no option name is ever cut, whatever the terminal width: piped output, COLUMNS=40,
60, 80, 200, or a width forced onto Click's formatter below its 50-column floor.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from harness.cli import app


def _walk(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


ROOT = typer.main.get_command(app)
COMMANDS = list(_walk(ROOT))
IDS = [" ".join(path) or "pdbench" for path, _ in COMMANDS]
# ("env", n): COLUMNS=n, as a terminal or a pipe sets it; ("forced", n): terminal_width=n
# on the context, which skips Click's 50-column floor.
WIDTHS = [("env", 40), ("env", 60), ("env", 80), ("env", 200), ("forced", 40)]

# An option name in the name column: a leading dash, not inside a metavar like <base-url>.
NAME = re.compile(r"(?<![\w<-])--?\w[\w-]*")


def _options(cmd) -> list:
    return [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def _names(opt) -> list[str]:
    return [*opt.opts, *opt.secondary_opts]


def _help(path: tuple[str, ...], mode: str = "env", width: int = 100) -> str:
    """`pdbench <path> --help` as CliRunner.invoke runs it, on the command tree built once
    (invoke rebuilds it from the app on every call, which is most of its time)."""
    env = {"COLUMNS": str(width) if mode == "env" else "80", "TERMINAL_WIDTH": None}
    extra = {"terminal_width": width} if mode == "forced" else {}
    with CliRunner().isolation(env=env) as (_, _, output):
        with pytest.raises(SystemExit) as exit_:
            ROOT.main([*path, "--help"], prog_name="pdbench", **extra)
        text = output.getvalue().decode()
    assert exit_.value.code in (0, None), text
    return text


def _section(text: str, title: str) -> list[str]:
    """The lines of one help section ("Options:", "Commands:"), up to the next one."""
    lines = text.splitlines()
    if f"{title}:" not in lines:
        return []
    body = lines[lines.index(f"{title}:") + 1 :]
    end = next((i for i, line in enumerate(body) if line and not line.startswith(" ")), len(body))
    return body[:end]


def _entries(text: str) -> list[tuple[str, str]]:
    """(name column, whole entry) per option: an entry starts at a line "  -..." and runs
    over the more-indented lines after it."""
    entries: list[list[str]] = []
    for line in _section(text, "Options"):
        if re.match(r"^  -", line):
            entries.append([line])
        elif entries and line.startswith("    "):
            entries[-1].append(line)
    return [(re.split(r"\s{2,}", e[0].strip())[0], " ".join(x.strip() for x in e)) for e in entries]


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_every_parameter_has_help(path, cmd):
    missing = [p.name for p in cmd.params if not (p.help or "").strip()]
    assert not missing, f"pdbench {' '.join(path)}: no help text for {missing}"
    multiline = [p.name for p in cmd.params if "\n" in p.help.strip()]
    assert not multiline, f"pdbench {' '.join(path)}: help is not one line for {multiline}"


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
@pytest.mark.parametrize(("mode", "width"), WIDTHS, ids=[f"{m}{w}" for m, w in WIDTHS])
def test_help_never_cuts_an_option_name(path, cmd, mode, width):
    text = _help(path, mode, width)
    assert "…" not in text
    options = _options(cmd)
    known = {n for o in options for n in _names(o)} | {"-h", "--help"}
    heads = [set(NAME.findall(head)) for head, _ in _entries(text)]
    for head in heads:
        assert head and head <= known, f"cut or unknown option name in {head} at {mode} {width}:\n{text}"
    for opt in options:
        assert any(set(_names(opt)) <= head for head in heads), (
            f"{_names(opt)} not shown whole at {mode} {width}:\n{text}"
        )
    # A group lists its commands with their whole summaries, wrapped rather than cut with "...".
    commands = _section(text, "Commands")
    assert not any(line.rstrip().endswith("...") for line in commands), text
    for name in getattr(cmd, "commands", {}):
        assert any(line.split()[:1] == [name] for line in commands), f"{name} missing:\n{text}"


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_help_states_every_default(path, cmd):
    entries = dict(_entries(_help(path)))
    for opt in _options(cmd):
        entry = next(e for head, e in entries.items() if set(_names(opt)) <= set(NAME.findall(head)))
        assert re.search(r"default|required", entry, re.I), f"no default stated: {entry}"


def _imported(tmp_path: Path, *args: str) -> set[str]:
    """The modules in sys.modules when `pdbench ARGS` (harness.cli.main, as the entry point and
    `python -m harness` run it) exits."""
    out = tmp_path / "modules.json"
    code = (
        "import atexit, json, sys; "
        f"atexit.register(lambda: open({str(out)!r}, 'w').write(json.dumps(sorted(sys.modules)))); "
        f"sys.argv = ['pdbench', *{list(args)!r}]; "
        "from harness.cli import main; main()"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(out.read_text()))


def test_a_command_imports_its_own_module_only_and_the_help_lists_them_all(tmp_path: Path) -> None:
    from harness.cli import MODULES

    # The precondition: `--help` imports every command module, with the heavy ones among them.
    every = _imported(tmp_path, "--help")
    assert {f"harness.cli.{m}" for m in MODULES} <= every
    assert {"harness.proxy.app", "harness.config.schema", "harness.render.job"} & every
    # `pdbench node`, which every job starts on each node: none of the others' modules.
    node = _imported(tmp_path, "node", "--help")
    assert "harness.cli.node" in node
    assert node & {f"harness.cli.{m}" for m in MODULES if m != "node"} == set()
    assert node & {"harness.proxy.app", "harness.config.schema", "aiohttp", "numpy"} == set()
    # A typo still gets the full list to suggest from.
    r = subprocess.run([sys.executable, "-m", "harness", "nod"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Did you mean 'node'?" in r.stderr


def test_every_command_module_is_in_the_entry_points_list() -> None:
    """A new module in harness/cli that harness.cli.MODULES leaves out would never register."""
    from harness.cli import MODULES

    shared = {"__init__", "root", "options", "formatting"}
    files = {p.stem for p in (Path(__file__).resolve().parents[2] / "harness" / "cli").glob("*.py")} - shared
    assert files == set(MODULES)


def test_the_cli_starts_without_the_servers_it_only_registers() -> None:
    """Every pdbench process (a job's node runtime, power sampler, client) registers every
    command; the proxy's and the mock engine's aiohttp servers and numpy load only when their
    command runs (0.5 s of each process's start on 2 cores, commit bed111f)."""
    heavy = ["aiohttp", "numpy", "harness.proxy.server", "harness.mock_engine.server"]
    code = (
        "import sys\nsys.argv = ['pdbench', '--help']\nimport harness.cli\n"
        "try:\n    harness.cli.main()\nexcept SystemExit:\n    pass\n"
        f"print('loaded:', *[m for m in {heavy!r} if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "proxy" in r.stdout, r.stderr  # precondition: the help listed `proxy`
    (loaded,) = [line for line in r.stdout.splitlines() if line.startswith("loaded:")]
    assert loaded == "loaded:", loaded
    # ... and the command still runs its server: the name resolves to the real one on use.
    from harness import proxy
    from harness.proxy.server import serve

    assert proxy.serve is serve
