"""One result file -> one Point, whichever client wrote it.

Reads pdbench's files (with a `metadata` block), upstream `vllm bench serve --save-result`,
InferenceX's benchmark_serving fork (no `failed`, `request_goodput:` with a trailing colon) and
srt-slurm's sa-bench (legacy keys such as `total_input` and `percentiles_<m>_ms`). A file that is
not a usable result raises NotAResult with the reason.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from harness.report.points import Note, Point
from harness.report.result_names import ISL_OSL, NameParts, is_srt_slurm_name, parse_name
from harness.rundir.bottleneck_summary import BottleneckSummary
from harness.rundir.kv_handoff_summary import KvHandoffSummary
from harness.rundir.prefix_cache_summary import PrefixCacheSummary
from harness.rundir.profile_summary import ProfileSummary
from harness.rundir.schedule_summary import ScheduleSummary
from harness.rundir.sentinel_summary import SentinelSummary
from harness.rundir.session_summary import SessionSummary

# Key aliases, first present wins (srt-slurm's rollup does the same across sa-bench versions).
ALIASES: dict[str, tuple[str, ...]] = {
    "max_concurrency": ("max_concurrency", "concurrency"),
    "total_token_throughput": ("total_token_throughput", "total_throughput"),
    "output_throughput": ("output_throughput", "output_token_throughput"),
    "total_input_tokens": ("total_input_tokens", "total_input"),
    "total_output_tokens": ("total_output_tokens", "total_output"),
    "request_goodput": ("request_goodput", "request_goodput:"),
    "model_id": ("model_id", "model"),
    "isl": ("random_input_len", "isl", "input_len"),
    "osl": ("random_output_len", "osl", "output_len"),
}

VERDICTS = ("valid", "invalid", "unverified")
# Fields read as counts or numbers: one of another type is left out of the report, with a warning.
INTEGERS = ("completed", "failed", "not_sent", "num_prompts", *ALIASES["isl"], *ALIASES["osl"])
NUMBERS = ("duration", "benchmark_start_time_unix")
METADATA_INTEGERS = ("prefill_gpus", "decode_gpus", "gpus")
M = TypeVar("M", bound=BaseModel)


class NotAResult(Exception):
    """A file that is not a usable result; the message is the reason."""


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _first(data: dict[str, Any], name: str) -> tuple[str | None, Any]:
    for key in ALIASES.get(name, (name,)):
        if data.get(key) is not None:
            return key, data[key]
    return None, None


def _int(v: Any) -> int | None:
    n = _number(v)
    if n is None or not math.isfinite(n) or n != int(n):
        return None
    return int(n)


def _source(path: Path, data: dict[str, Any], run_root: Path) -> str:
    md = data.get("metadata")
    if isinstance(md, dict) and "pdbench_version" in md:
        return "pdbench"
    if "request_goodput:" in data:
        return "inferencex"
    if (
        is_srt_slurm_name(path.name)
        or "total_input" in data
        or "peak_output_tokens_per_s" in data
        or "percentiles_ttft_ms" in data
        or any(p.name.startswith("sa-bench") for p in path.relative_to(run_root).parents)
    ):
        return "srt-slurm"
    return "vllm"


def _ms_keys(data: dict[str, Any]) -> dict[str, float]:
    """Every numeric `*ms` key, plus legacy `percentiles_<m>_ms: [[p, v], ...]` as `p<P>_<m>_ms`."""
    out: dict[str, float] = {}
    for key, value in data.items():
        if not key.endswith("ms"):
            continue
        n = _number(value)
        if n is not None and math.isfinite(n):
            out[key] = n
            continue
        m = re.fullmatch(r"percentiles_(\w+)_ms", key)
        if m and isinstance(value, list):
            for entry in value:
                if isinstance(entry, (list, tuple)) and len(entry) == 2:
                    p, v = _number(entry[0]), _number(entry[1])
                    if p is not None and v is not None:
                        label = str(int(p)) if p.is_integer() else repr(p)
                        out.setdefault(f"p{label}_{m.group(1)}_ms", v)
    return out


def _path_isl_osl(name: NameParts, path: Path, run_root: Path) -> tuple[int | None, int | None]:
    """The file name's ISL/OSL, else the nearest folder's up to the run directory's own name."""
    if name.isl is not None and name.osl is not None:
        return name.isl, name.osl
    for part in [*(p.name for p in path.relative_to(run_root).parents if p.name), run_root.name]:
        m = ISL_OSL.search(part)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None, None


def _validity(md: dict[str, Any], pdbench: bool) -> tuple[str | None, list[str]]:
    """The point's verdict and why it is not valid. `validity.verdict` when recorded, else the
    older `valid` flag; a pdbench point with neither recorded no evidence: unverified."""
    block = md["validity"] if isinstance(md.get("validity"), dict) else {}
    verdict = block.get("verdict") if block.get("verdict") in VERDICTS else None
    if verdict is None and isinstance(md.get("valid"), bool):
        verdict = "valid" if md["valid"] else "invalid"
    if verdict is None:
        return ("unverified", ["no validity verdict recorded"]) if pdbench else (None, [])
    reasons: Any = md.get("validity_reasons") or md.get("invalid_reasons") or block.get("reasons")
    if isinstance(reasons, str):
        reasons = [reasons]
    return verdict, [] if verdict == "valid" else [str(r) for r in reasons or []]


def _outputs_match(md: dict[str, Any]) -> str | None:
    """The outputs_match rule's status (passed | failed | not_checked), when the point has one."""
    block = md.get("validity")
    rules = block.get("rules") if isinstance(block, dict) else None
    for rule in rules if isinstance(rules, list) else []:
        if isinstance(rule, dict) and rule.get("name") == "outputs_match":
            return str(rule.get("status"))
    return None


def _started(data: dict[str, Any]) -> float | None:
    """When the point began, for the sweep's order: `benchmark_start_time_unix`, else `date`
    (the client's YYYYMMDD-HHMMSS, UTC)."""
    start = _number(data.get("benchmark_start_time_unix"))
    if start is not None and math.isfinite(start):
        return start
    try:
        return datetime.strptime(str(data.get("date")), "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _mistyped(data: dict[str, Any], md: dict[str, Any]) -> list[str]:
    """Each field present with a value of the wrong type, which the report would leave out silently."""
    out = []

    def check(where: str, value: Any, ok: bool, want: str) -> None:
        if value is not None and not ok:
            out.append(f"field {where} is {value!r} ({type(value).__name__}), not {want}; not used")

    for key in INTEGERS:
        check(key, data.get(key), _int(data.get(key)) is not None, "an integer")
    for key in NUMBERS:
        check(key, data.get(key), _number(data.get(key)) is not None, "a number")
    for key, value in data.items():
        if key.endswith("ms") and not (key.startswith("percentiles_") and isinstance(value, list)):
            n = _number(value)
            check(key, value, n is not None and math.isfinite(n), "a finite number")
    check("metadata", data.get("metadata"), isinstance(data.get("metadata"), dict), "an object")
    for key in METADATA_INTEGERS:
        check(f"metadata.{key}", md.get(key), _int(md.get(key)) is not None, "an integer")
    return out


def _where(section: str, loc: tuple[int | str, ...]) -> str:
    """A pydantic error's location as a path into the section: `sentinels.tolerance.max_diverged`,
    `sentinels.first_divergence[2]`."""
    return section + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _section(section: str, model: type[M], block: Any) -> M:
    """One section of the result through its one definition; ValueError naming each bad field."""
    try:
        return model.model_validate(block)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            # A field's own value helps; the whole section (a missing key, counts) does not.
            shown = err["type"] != "missing" and not isinstance(err["input"], dict)
            value = f" ({err['input']!r})" if shown else ""
            problems.append(f"{_where(section, err['loc'])}: {err['msg'].removeprefix('Value error, ')}{value}")
        raise ValueError("; ".join(problems)) from None


# A result's optional sections, each read through its model; a bad one is noted and left out.
SECTIONS: dict[str, tuple[type[BaseModel], str]] = {
    "sentinels": (SentinelSummary, "the point's outputs check is not shown"),
    "sessions": (SessionSummary, "its per-turn table is not shown"),
    "schedule": (ScheduleSummary, "its trace timing is not shown"),
    "prefix_cache": (PrefixCacheSummary, "its prefix-cache hits are not shown"),
    "bottleneck": (BottleneckSummary, "its bottleneck verdict is not shown"),
    "profile": (ProfileSummary, "its profile is not shown"),
    "kv_handoff": (KvHandoffSummary, "its KV handoff is not shown"),
}


def _sections(data: dict[str, Any], path: Path, notes: list[Note]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (model, lost) in SECTIONS.items():
        if data.get(key) is None:
            continue
        try:
            out[key] = _section(key, model, data[key])
        except ValueError as e:
            notes.append(Note(path, f"{e}; {lost}"))
    return out


def read_point(path: Path, run_root: Path, notes: list[Note]) -> Point:
    """Parse one file; raise NotAResult(reason) if it is not a usable result."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise NotAResult(f"unreadable: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise NotAResult("not a text file") from None
    except json.JSONDecodeError as e:
        raise NotAResult(f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, dict):
        raise NotAResult(f"not a result: the JSON is {type(data).__name__}, not an object")
    md: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
    notes += [Note(path, text, warning=True) for text in _mistyped(data, md)]
    name = parse_name(path.name[:-5] if path.name.endswith(".json") else path.name)

    def throughput(name: str) -> float:
        key, v = _first(data, name)
        if key is not None:
            n = _number(v)
            if n is None or not math.isfinite(n) or n < 0:
                raise NotAResult(f"{key} is not a finite, non-negative number ({v!r})")
            return n
        # Fall back to tokens / duration when only the totals are there.
        tokens_keys = (
            ("total_output_tokens",) if name == "output_throughput" else ("total_input_tokens", "total_output_tokens")
        )
        duration = _number(data.get("duration"))
        totals = [_number(_first(data, k)[1]) for k in tokens_keys]
        if duration and duration > 0 and all(t is not None for t in totals):
            notes.append(Note(path, f"{name} computed from token totals / duration (no such key)"))
            return sum(t for t in totals if t is not None) / duration
        raise NotAResult(f"missing key {name} (nor {', '.join(ALIASES[name][1:])}), not a benchmark result")

    total = throughput("total_token_throughput")
    output = throughput("output_throughput")
    if output > total:
        raise NotAResult(f"output_throughput ({output:g}) exceeds total_token_throughput ({total:g})")

    key, v = _first(data, "max_concurrency")
    conc = _int(v) if key else None
    from_name = name.concurrency
    if key and conc is None and v is not None:
        raise NotAResult(f"{key} is not an integer ({v!r})")
    if conc is None:
        conc = from_name
    elif from_name is not None and from_name != conc:
        notes.append(Note(path, f"the file name says concurrency {from_name}, {key} says {conc}; using {conc}"))
    if conc is None or conc <= 0:
        raise NotAResult("no concurrency: max_concurrency is missing or null and the file name has none")

    completed = _int(data.get("completed"))
    failed, failed_derived = _int(data.get("failed")), False
    num_prompts = _int(data.get("num_prompts"))
    if failed is None and completed is not None and num_prompts is not None and num_prompts >= completed:
        failed, failed_derived = num_prompts - completed, True
    requests = completed + failed if completed is not None and failed is not None else num_prompts

    # GPUs: the metadata's working GPUs, else the file name as InferenceX's workflow reads it.
    g, c, d = name.gpus, name.ctx, name.gen
    pg, dg = _int(md.get("prefill_gpus")), _int(md.get("decode_gpus"))
    gpus_from: str | None = None
    if pg is not None and dg is not None:
        gpus_from = "metadata"
        if g is not None and (g != pg + dg or (c is not None and (c, d) != (pg, dg))):
            notes.append(
                Note(
                    path,
                    f"the file name's GPU split (gpus {g}, ctx {c}, gen {d}) differs from "
                    f"the metadata's (prefill {pg}, decode {dg}); using the metadata",
                )
            )
    elif md.get("disagg") is False and _int(md.get("gpus")) is not None:
        # An aggregated deployment (a pdbench baseline): its GPUs, as InferenceX counts them.
        pg, dg, gpus_from = _int(md.get("gpus")), 0, "metadata (aggregated)"
    elif g is not None and c is not None and d is not None:
        pg, dg, gpus_from = c, d, "file name"
    elif g is not None:
        # InferenceX: without _ctx_/_gen_ all GPUs belong to the one (aggregated) worker.
        pg, dg, gpus_from = g, 0, "file name (no ctx/gen: all GPUs counted as prefill, decode 0)"

    isl = osl = None
    for src in (data, md):
        if isl is None:
            isl = _int(_first(src, "isl")[1])
        if osl is None:
            osl = _int(_first(src, "osl")[1])
    if isl is None or osl is None:
        pi, po = _path_isl_osl(name, path, run_root)
        isl, osl = isl if isl is not None else pi, osl if osl is not None else po

    rate = data.get("request_rate")
    if rate is None:
        rate = name.rate
    source = _source(path, data, run_root)
    verdict, reasons = _validity(md, source == "pdbench")
    model = _first(data, "model_id")[1]
    fp = md.get("recipe_fingerprint") or data.get("recipe_fingerprint")
    sections = _sections(data, path, notes)
    return Point(
        path=path,
        source=source,
        concurrency=conc,
        request_rate=None if rate is None else str(rate),
        isl=isl,
        osl=osl,
        model=str(model) if model is not None else None,
        completed=completed,
        failed=failed,
        failed_derived=failed_derived,
        requests=requests,
        total_token_throughput=total,
        output_throughput=output,
        prefill_gpus=pg,
        decode_gpus=dg,
        gpus_from=gpus_from,
        ms=_ms_keys(data),
        metadata=md,
        valid={"valid": True, "invalid": False}.get(verdict or ""),
        validity_reasons=reasons,
        fingerprint=str(fp) if fp else None,
        stop_reason=str(data["stop_reason"]) if data.get("stop_reason") else None,
        not_sent=_int(data.get("not_sent")),
        verdict=verdict,
        ttft_breakdown=data["ttft_breakdown"] if isinstance(data.get("ttft_breakdown"), dict) else None,
        outputs_match=_outputs_match(md),
        started=_started(data),
        client=data["client"] if isinstance(data.get("client"), dict) else None,
        **sections,
    )
