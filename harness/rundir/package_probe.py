"""The runtime record's probe (state/runtime-<server>.json: written by the node, read by the bench
client). Run inside a server's own interpreter (`python -c <this file's text>`): the versions of the
packages that decide what a result measured, as one JSON object on stdout.

Standard library only, and nothing is imported but pdbench's own version: it must run in any
image's python, fast, and never start a GPU runtime. Versions come from the installed
distributions' metadata; a package that is not there is null, with the reason.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import sys
from collections.abc import Mapping, Sequence

# How long the node gives one probe; the bench client waits for the records beyond it.
PROBE_TIMEOUT_S = 20.0

# (the key in the record, distribution names to try in order, the import name). A build may
# ship a package under another distribution name (nixl-cu12); the import name finds it then.
Spec = tuple[str, tuple[str, ...], str]
# What every probe reports; the caller adds the KV connectors' packages (harness.kv_connectors),
# which this script, run with the standard library alone, cannot import.
PACKAGES: tuple[Spec, ...] = (
    # The installed vLLM distribution: its version carries the build's label (0.32.0+cpu), which
    # the server's own GET /version (vllm.__version__) leaves out.
    ("vllm_package", ("vllm",), "vllm"),
    ("torch", ("torch",), "torch"),
)

_by_import: list[Mapping[str, list[str]]] = []


def _distributions_of(module: str) -> list[str]:
    if not _by_import:  # reads every distribution's file list: once, and only when needed
        _by_import.append(md.packages_distributions())
    return _by_import[0].get(module, [])


def package_version(dists: tuple[str, ...], module: str) -> str | None:
    for name in (*dists, *_distributions_of(module)):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def pdbench_source_version() -> str | None:
    """pdbench run from its tree on PYTHONPATH (as in a container) has no distribution."""
    try:
        import harness
    except ImportError:
        return None
    version = getattr(harness, "__version__", None)
    return version if isinstance(version, str) else None


def keys(extra: Sequence[Spec]) -> tuple[str, ...]:
    """The record's keys when the probe is given these packages besides its own."""
    return tuple(key for key, _, _ in (*PACKAGES, *extra))


def probe(extra: Sequence[Spec] = ()) -> dict[str, object]:
    versions: dict[str, str | None] = {}
    reasons: dict[str, str] = {}
    for key, dists, module in (*PACKAGES, *extra):
        version = package_version(dists, module)
        if version is None and module == "harness":  # pdbench's own tree (the bundled connector)
            version = pdbench_source_version()
        versions[key] = version
        if version is None:
            reasons[key] = f"not installed in {sys.executable} (no distribution {' or '.join(dists)})"
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "versions": versions,
        "reasons": reasons,
    }


if __name__ == "__main__":
    # The one argument: the packages to report besides PACKAGES, as JSON [[key, [dists], module]].
    extra = [(str(k), tuple(d), str(m)) for k, d, m in json.loads(sys.argv[1])] if len(sys.argv) > 1 else []
    json.dump(probe(extra), sys.stdout)
