"""`pdbench proxy`: its options are generated from ProxyConfig, registered by harness.cli.proxy.

Each field is a flag of the same name (its json_schema_extra may rename it, give it a metavar,
a default's text or a unit); the field's description is the help. Typer reads a command's
parameters from its signature: the generated one is set as __signature__ below, as
`pdbench bench` does with ClientConfig.
"""

from __future__ import annotations

import inspect
from types import UnionType
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from harness import exit_codes, kv_connectors
from harness.proxy.config import ProxyConfig


def serve(config: ProxyConfig) -> None:
    """harness.proxy.server.serve, imported on use: its aiohttp and metrics stack would cost
    every other `pdbench` command a quarter of a second at start (the CLI registers this one in
    every process, and each job starts several pdbench processes per node)."""
    from harness.proxy.server import serve as run

    run(config)


def _fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=exit_codes.USAGE)


def _meta(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def _optional(annotation: Any) -> Any:
    """X | None -> X."""
    if get_origin(annotation) in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _choices(name: str, annotation: Any) -> tuple[str, ...]:
    if name == "connector":  # the table's names, each with what it is
        return (kv_connectors.described(kv_connectors.proxy_names()),)
    return tuple(map(str, get_args(annotation))) if get_origin(annotation) is Literal else ()


def _default_text(field: FieldInfo) -> str:
    meta = _meta(field)
    if "cli_default" in meta:
        return str(meta["cli_default"])
    value = field.get_default(call_default_factory=True)
    if "cli_scale" in meta:
        value /= meta["cli_scale"]
    return f"{value:g}" if isinstance(value, float) else str(value)


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    meta = _meta(field)
    flag = (meta.get("cli_flags") or [f"--{name.replace('_', '-')}"])[0]
    base = _optional(field.annotation)
    help_text = field.description or ""
    if choices := _choices(name, base):
        help_text += f" One of: {', '.join(choices)}."
    if get_origin(base) is list:
        annotation: Any = list[get_args(base)[0]] | None  # type: ignore[misc]
        help_text += " Repeatable."
    elif base is bool:
        annotation = bool
    elif "cli_scale" in meta:
        annotation = float | None
    elif get_origin(base) is Literal:
        annotation = str | None  # ProxyConfig checks the value and names the choices
    else:
        annotation = base | None
    extra = {"metavar": meta["cli_metavar"]} if "cli_metavar" in meta else {}
    default = False if base is bool else None
    help_text += f" [default: {'off' if base is bool else _default_text(field)}]"
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=annotation,
        default=typer.Option(default, flag, help=help_text, show_default=False, **extra),
    )


_PARAMETERS = [_option(name, field) for name, field in ProxyConfig.model_fields.items()]


def config_from_flags(flags: dict[str, Any]) -> ProxyConfig:
    """The flags given (None or []: not given) as a ProxyConfig; exits 2 naming a bad one."""
    values: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None or value == []:
            continue
        scale = _meta(ProxyConfig.model_fields[name]).get("cli_scale")
        values[name] = int(value * scale) if scale else value
    try:
        return ProxyConfig(**values)
    except ValidationError as exc:
        _fail("; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()))


def proxy_command(**flags: Any) -> None:
    """Run the prefill/decode proxy (NIXL, pdbench, MoRI-IO and Mooncake flows)."""
    serve(config_from_flags(flags))


proxy_command.__signature__ = inspect.Signature(_PARAMETERS)  # type: ignore[attr-defined]
proxy_command.__annotations__ = {p.name: p.annotation for p in _PARAMETERS} | {"return": None}
