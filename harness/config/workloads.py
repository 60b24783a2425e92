"""Several workloads in one job (benchmark.workloads): the names, and how a workload's mapping
becomes a whole benchmark section.

A workload's settings are the job's benchmark section deep-merged with the workload's mapping:
a nested mapping is merged key by key, anything else (a list, a number) replaces the job's. The
result is validated as a benchmark section of its own (BenchmarkSettings._check_workloads).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

# A workload's name becomes a folder (workloads/<name>/), a process and a file name.
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
# Keys a workload may not set: it is one sweep, not a job's list of them, and an SLO search
# measures one deployment per job (slo_search.json and repeats/ are the run's).
REFUSED = ("workloads", "slo_search")


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise ValueError(
            f"workloads: name {name!r} must be 1-32 lower-case letters, digits and '-', not starting with '-'"
        )


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` deep-merged in: mappings key by key, every other value replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def nested_error(name: str, err: ValidationError) -> str:
    """A workload's first validation error as `workloads.<name>.<key>: what` (the loader prefixes
    `benchmark.`), so the message names the key the user wrote."""
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] != "value_error" and "input" in first:
        msg = f"{msg} (got {first['input']!r})"
    # A check across keys names its key first ("concurrency: ..."): that key is the one meant.
    if not key and (about := re.match(r"(\S+): ", msg)):
        key, msg = about.group(1), msg[about.end() :]
    return f"workloads.{name}{'.' + key if key else ''}: {msg}"
