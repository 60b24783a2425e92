"""How every `pdbench` command's help reads, whichever module defines the command.

Metavars name what to give (N, SECONDS, PATH, TEXT, a choice's values), never a Python type
(Typer would write `<int>`, `<list[str]>`); every default is one `[default: X]` at the end of
the help, a flag's as on/off; the usage line shows arguments as Click writes them (RECIPE,
[DIR], RUN...), not as `{recipe}`.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from typer.core import TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:
    # Typer carries its own copy of Click: its classes, not the click package's.
    from typer._click import Context, HelpFormatter, Parameter

# Click and Typer put two spaces before the "[default: ...]" or "[required]" they add.
_TAIL = re.compile(r"\s{2,}\[(default|required)")


def _metavar(param: Parameter) -> str:
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and desc.is_choice:
        return "|".join(str(c.value if isinstance(c, Enum) else c) for c in desc.choices or ())
    kind: Any = desc.annotation if desc is not None else str
    if desc is not None and desc.is_list:
        kind = (get_args(kind) or (str,))[0]
    if kind is int:
        return "N"
    if kind is float:
        return "SECONDS" if (param.name or "").endswith("_s") else "NUMBER"
    if kind is Path:
        return "PATH"
    return "TEXT"


def _default_text(value: Any) -> str:
    if value is None or value == [] or value == ():
        return "none"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _plain(opt: TyperOption) -> None:
    """One style of default: written once, at the end of the help."""
    help_ = (opt.help or "").rstrip()
    if opt.metavar is None and not opt.is_flag:
        opt.metavar = _metavar(opt)
    if "[default" in help_ or opt.required or "(required" in help_ or opt.show_default is False:
        opt.show_default = False
        opt.help = help_
        return
    opt.show_default = False
    text = ("on" if opt.default else "off") if opt.is_bool_flag else _default_text(opt.default)
    opt.help = f"{help_} [default: {text}]"


class Command(TyperCommand):
    """A Typer command whose help follows the house style above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if isinstance(p, TyperOption):
                _plain(p)
            elif p.metavar is None:
                p.metavar = (p.name or "value").upper()

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name != "argument":
                continue
            name = p.metavar or (p.name or "").upper()
            name = name if p.required else f"[{name}]"
            pieces.append(f"{name}..." if p.nargs != 1 else name)
        return pieces

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        args: list[tuple[str, str]] = []
        opts: list[tuple[str, str]] = []
        for p in self.get_params(ctx):
            record = p.get_help_record(ctx)
            if record is None:
                continue
            if p.param_type_name == "argument":
                # Typer writes the name and then the metavar again ("RECIPE RECIPE"): the name once.
                name = (p.metavar or "") + ("..." if p.nargs != 1 else "")
                args.append((name, _TAIL.sub(r" [\1", record[1])))
            else:
                opts.append((record[0], _TAIL.sub(r" [\1", record[1])))
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)


class Group(TyperGroup):
    """The top-level `pdbench`: its own options (--version) in the same style."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if isinstance(p, TyperOption):
                _plain(p)
