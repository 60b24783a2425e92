"""`pdbench bench`: run a benchmark sweep from a JSON ClientConfig and/or flags.

Exit codes: 0 every point written and no request failed; 1 a request failed, a point
could not be run, the target died or the total timeout hit (the results of the points
that ran are still written, a cut-short one with its `stop_reason`); 2 the
configuration is invalid; 130 Ctrl-C (the point it cut short is written, marked
interrupted; the points left are not run).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from harness import exit_codes
from harness.bench.client_config import ClientConfig

if TYPE_CHECKING:
    from harness.bench.sweep import PointOutcome


def _csv(value: str | None) -> list[str] | None:
    # Items stay strings: pydantic coerces them and names the bad one on error.
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _goodput(values: list[str]) -> dict[str, str]:
    """["ttft:500 tpot:50", "e2el:2000"] -> {"ttft": "500", ...}; ClientConfig checks names and numbers."""
    slos: dict[str, str] = {}
    for item in " ".join(values).replace(",", " ").split():
        name, sep, value = item.partition(":")
        if not sep or not name or not value:
            raise _fail(
                f"invalid benchmark config:\n  goodput: expected KEY:VALUE in ms, got {item!r}", exit_codes.USAGE
            )
        slos[name.strip()] = value.strip()
    return slos


def _fail(msg: str, code: int) -> typer.Exit:
    typer.echo(f"pdbench bench: {msg}", err=True)
    return typer.Exit(code)


def load_config(config: Path | None, overrides: dict[str, Any]) -> ClientConfig:
    """Merge the JSON file (if any) with the flags given; raise typer.Exit(2) if invalid."""
    data: dict[str, Any] = {}
    if config is not None:
        try:
            data = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise _fail(f"cannot read config {config}: {e}", exit_codes.USAGE) from None
        if not isinstance(data, dict):
            raise _fail(f"config {config} must hold a JSON object", exit_codes.USAGE)
    data |= {k: v for k, v in overrides.items() if v is not None}
    try:
        return ClientConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(x) for x in err['loc']) or '(config)'}: {err['msg']}" for err in e.errors()]
        raise _fail("invalid benchmark config:\n" + "\n".join(lines), exit_codes.USAGE) from None


# The options are generated from ClientConfig's fields (names, help, defaults), so a field
# added to BenchmarkSettings is a recipe key, a --config key and a flag at once. Typer
# reads a command's parameters from its signature: the generated one is set as
# __signature__ below, which keeps Typer's help formatting and the other commands' style.
# Nested models (validity thresholds) are set in --config or a recipe only.
_SCALARS = (int, float, str, bool)


def _cli_meta(field: FieldInfo) -> dict[str, Any]:
    """The field's CLI metadata (cli_default, cli_flags, cli_format; see harness.config.benchmark)."""
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def _unwrap(annotation: Any) -> Any:
    """X | None -> X and Annotated[X, ...] -> X (PositiveInt inside an Optional)."""
    if get_origin(annotation) in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _scalar(annotation: Any) -> type | None:
    """int | None -> int; Literal['a', 'b'] -> str; anything else -> None."""
    a = _unwrap(annotation)
    if get_origin(a) is Literal:
        return type(get_args(a)[0])
    return a if a in _SCALARS else None


def _default_text(field: FieldInfo) -> str:
    extra = _cli_meta(field)
    if "cli_default" in extra:
        return str(extra["cli_default"])
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _option(name: str, field: FieldInfo) -> inspect.Parameter | None:
    extra = _cli_meta(field)
    fmt = extra.get("cli_format")
    flags: list[str] = list(extra.get("cli_flags") or [f"--{name.replace('_', '-')}"])
    base = _unwrap(field.annotation)
    choices = get_args(base) if get_origin(base) is Literal else ()
    what = f" One of: {', '.join(map(str, choices))}." if choices else ""
    if fmt == "csv":
        annotation: Any = str | None
        what += " Comma-separated."
    elif fmt == "repeat":
        item = get_args(field.annotation)[0]
        annotation = list[item] | None  # type: ignore[valid-type]
        what += " Repeatable."
    elif fmt == "kv":
        annotation = list[str] | None
        what += " As KEY:VALUE, repeatable or several in one value."
    elif fmt == "json":
        annotation = str | None
    else:
        scalar = _scalar(field.annotation)
        if scalar is None:
            return None  # a nested model: --config or a recipe only
        annotation = scalar | None
        if scalar is bool:
            flags = [f"{flags[0]}/--no-{flags[0].removeprefix('--')}"]
    when = "(required, here or in --config)" if field.is_required() else f"[default: {_default_text(field)}]"
    help_text = f"{field.description}{what} {when}"
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=annotation,
        default=typer.Option(None, *flags, help=help_text, show_default=False),
    )


# Where a flag is found in --help: what to reach first, then the settings in recipe order.
_BINDINGS = ("base_url", "model", "tokenizer", "result_dir")


def _parameters() -> list[inspect.Parameter]:
    config = inspect.Parameter(
        "config",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Path | None,
        default=typer.Option(
            None,
            "--config",
            show_default=False,
            help="JSON file holding a ClientConfig; flags override it [default: none]",
        ),
    )
    fields = ClientConfig.model_fields
    order = [*_BINDINGS, *(n for n in fields if n not in _BINDINGS)]
    params = [_option(n, fields[n]) for n in order]
    return [config, *(p for p in params if p is not None)]


def _overrides(values: dict[str, Any]) -> dict[str, Any]:
    """Flag values (None: not given) -> ClientConfig fields; a bad format exits 2 naming the flag."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value == []:
            continue
        field = ClientConfig.model_fields[name]
        fmt = _cli_meta(field).get("cli_format")
        if fmt == "csv":
            value = _csv(value)
        elif fmt == "kv":
            value = _goodput(value)
        elif fmt == "json":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise _fail(f"invalid benchmark config:\n  {name}: not JSON: {e}", exit_codes.USAGE) from None
        out[name] = value
    return out


def bench_command(**flags: Any) -> None:
    """Benchmark a running OpenAI-compatible server over a concurrency sweep."""
    config = flags.pop("config")
    cfg = load_config(config, _overrides(flags))

    # Thousands of connections need a descriptor each: the soft limit up to the hard one (the
    # load processes inherit it), so the client never fails for want of its own descriptors.
    from harness.limits import raise_open_files

    raise_open_files()
    # Heavy imports only when running.
    from harness.bench.dataset import DatasetError
    from harness.bench.external import run_external_clients
    from harness.bench.results import ResultDirUnwritable, ResultExistsError
    from harness.bench.stops import WARMUPS_FAILED
    from harness.bench.sweep import TargetDied, run_sweep_detailed
    from harness.bench.trace import TraceError

    try:
        outcomes = run_sweep_detailed(cfg) if cfg.client == "pdbench" else []
        # After a Ctrl-C that cut the sweep short, no other client starts.
        external = [] if any(o.interrupted for o in outcomes) else run_external_clients(cfg)
    except KeyboardInterrupt:
        raise _fail("interrupted (Ctrl-C)", exit_codes.INTERRUPTED) from None
    except TargetDied as e:
        raise _fail(f"the target cannot serve, nothing was sent: {e}", exit_codes.FAILED) from None
    except (ResultExistsError, ResultDirUnwritable, DatasetError, TraceError) as e:
        raise _fail(str(e), exit_codes.FAILED) from None
    except OSError as e:  # e.g. the tokenizer or a result directory that cannot be read or written
        raise _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e), exit_codes.FAILED) from None
    except Exception as e:  # a defect: its type helps whoever reports it
        raise _fail(f"unexpected error ({type(e).__name__}): {e}", exit_codes.FAILED) from None
    if any(o.interrupted for o in outcomes):
        raise _fail(interrupted_summary(outcomes, cfg.result_dir), exit_codes.INTERRUPTED)
    if warm := next((o for o in outcomes if o.error and o.error.startswith(WARMUPS_FAILED)), None):
        raise _fail(f"C={warm.concurrency}: {warm.error}; the points left were not run", exit_codes.FAILED)
    if not all(o.ok for o in outcomes):
        bad = [f"C={o.concurrency} ({o.error or o.counts()})" for o in outcomes if not o.ok]
        raise _fail("not every point succeeded: " + "; ".join(bad), exit_codes.FAILED)
    if failed := [o.summary for o in external if not o.ok]:
        raise _fail("; ".join(failed), exit_codes.FAILED)


def interrupted_summary(outcomes: list[PointOutcome], result_dir: str) -> str:
    """What a Ctrl-C kept and what it skipped, and how to finish the sweep."""

    def name(o: PointOutcome) -> str:
        return f"C={o.concurrency}" + (f" {o.shape}" if o.shape else "")

    lines = ["interrupted (Ctrl-C)"]
    for o in outcomes:
        if o.interrupted and o.path is not None:
            lines.append(f"  {name(o)}: cut short, {o.counts()}, written as interrupted -> {o.path}")
        elif o.interrupted:
            lines.append(f"  {name(o)}: not run")
        elif o.path is not None:
            lines.append(f"  {name(o)}: {'kept' if o.kept else 'done'} -> {o.path}")
    lines.append(f"to finish the sweep: the same command with --resume (into {result_dir})")
    return "\n".join(lines)


bench_command.__signature__ = inspect.Signature(_parameters())  # type: ignore[attr-defined]
bench_command.__annotations__ = {p.name: p.annotation for p in _parameters()} | {"return": None}
