"""Find and read benchmark result files into one normalised shape.

Reads the files of pdbench (`concurrency_<C>_req_rate_<R>_gpus_<P+D>_ctx_<P>_gen_<D>.json` with a
`metadata` block), upstream `vllm bench serve --save-result`, InferenceX's benchmark_serving fork
(no `failed`, `request_goodput:` with a trailing colon) and srt-slurm's sa-bench
(`results_concurrency_<C>_gpus_<G>[_ctx_<P>_gen_<D>].json`, `_conc<N>_gpus_<G>...`, legacy keys such
as `total_input` and `percentiles_<m>_ms`). Every file that is not used is returned as a
`Skipped` with the reason; nothing is dropped silently.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# pdbench's own run files: part of every run directory, never results.
CONTROL_FILES = frozenset({"plan.json", "bench.json", "bench-aggregated.json", "status.json"})

# Names that carry a sweep point (used to find results in nested folders, e.g. srt-slurm's
# logs/sa-bench_isl_<I>_osl_<O>/), and the parts of a name that carry the GPU split.
_CONC_PATTERNS = (
    re.compile(r"concurrency_?(\d+)(?=[_.-]|$)"),
    re.compile(r"(?:^|_)conc_?(\d+)(?=[_.]|$)"),
    re.compile(r"(?:^|_)c(\d+)(?=_gpus_)"),
)
_GPUS = re.compile(r"_gpus_(\d+)(?=[_.]|$)")
_CTX = re.compile(r"_ctx_(\d+)(?=[_.]|$)")
_GEN = re.compile(r"_gen_(\d+)(?=[_.]|$)")
_ISL_OSL = re.compile(r"(?:^|[_-])isl_?(\d+)_osl_?(\d+)(?=[_.-]|$)")
_RATE = re.compile(r"req_rate_(inf|\d+(?:\.\d+)?)")

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


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


@dataclass(frozen=True)
class Note:
    """Something a reader should know about a file that was used (or a run argument)."""

    path: Path
    text: str


@dataclass
class Point:
    """One sweep point, whatever client wrote it. Latencies stay in ms under their file keys."""

    path: Path
    source: str  # pdbench | vllm | inferencex | srt-slurm
    concurrency: int
    request_rate: str | None
    isl: int | None
    osl: int | None
    model: str | None
    completed: int | None
    failed: int | None
    failed_derived: bool  # failed = num_prompts - completed (files without a `failed` key)
    total_token_throughput: float
    output_throughput: float
    prefill_gpus: int | None
    decode_gpus: int | None
    gpus_from: str | None
    ms: dict[str, float]  # every numeric key ending in "ms", in file order, aliases resolved
    metadata: dict[str, Any]
    valid: bool | None  # True / False for a valid / invalid verdict; None otherwise
    validity_reasons: list[str]  # why the verdict is not "valid"
    fingerprint: str | None
    stop_reason: str | None = None  # pdbench: why the point ended before every request was done
    # "valid" | "invalid" | "unverified" (a pdbench point without evidence); None: another
    # tool's file, which has no notion of validity.
    verdict: str | None = None
    ttft_breakdown: dict[str, Any] | None = None  # pdbench: where the point's TTFT went


@dataclass
class Run:
    path: Path
    label: str
    status: dict[str, Any] | None
    is_pdbench_run: bool
    points: list[Point] = field(default_factory=list)


@dataclass
class Loaded:
    runs: list[Run]
    skipped: list[Skipped]
    notes: list[Note]


class RunPathError(Exception):
    """A RUN_DIR argument that does not exist."""


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


def _last_match(pattern: re.Pattern[str], name: str) -> str | None:
    found = pattern.findall(name)
    return found[-1] if found else None


def name_concurrency(name: str) -> int | None:
    for pattern in _CONC_PATTERNS:
        m = _last_match(pattern, name)
        if m is not None:
            return int(m)
    return None


def name_gpus(name: str) -> tuple[int | None, int | None, int | None]:
    """(total, ctx, gen) from `_gpus_<N>[_ctx_<P>_gen_<D>]`, as InferenceX's workflow reads them."""
    g, c, d = (_last_match(p, name) for p in (_GPUS, _CTX, _GEN))
    return (int(g) if g else None, int(c) if c else None, int(d) if d else None)


def looks_like_result_name(name: str) -> bool:
    return name.endswith(".json") and name_concurrency(name[:-5]) is not None


def _source(path: Path, data: dict[str, Any], run_root: Path) -> str:
    md = data.get("metadata")
    if isinstance(md, dict) and "pdbench_version" in md:
        return "pdbench"
    if "request_goodput:" in data:
        return "inferencex"
    name = path.name
    if (
        name.startswith("results_concurrency_")
        or re.search(r"_conc\d", name)
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


def _path_isl_osl(path: Path, run_root: Path) -> tuple[int | None, int | None]:
    for part in [path.stem, *(p.name for p in path.relative_to(run_root).parents if p.name), run_root.name]:
        m = _ISL_OSL.search(part)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None, None


VERDICTS = ("valid", "invalid", "unverified")


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


class _Bad(Exception):
    pass


def read_point(path: Path, run_root: Path, notes: list[Note]) -> Point:
    """Parse one file; raise _Bad(reason) if it is not a usable result."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise _Bad(f"unreadable: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise _Bad("not a text file") from None
    except json.JSONDecodeError as e:
        raise _Bad(f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, dict):
        raise _Bad(f"not a result: the JSON is {type(data).__name__}, not an object")
    md: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
    stem = path.name[:-5] if path.name.endswith(".json") else path.name

    def throughput(name: str) -> float:
        key, v = _first(data, name)
        if key is not None:
            n = _number(v)
            if n is None or not math.isfinite(n) or n < 0:
                raise _Bad(f"{key} is not a finite, non-negative number ({v!r})")
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
        raise _Bad(f"missing key {name} (nor {', '.join(ALIASES[name][1:])}), not a benchmark result")

    total = throughput("total_token_throughput")
    output = throughput("output_throughput")
    if output > total:
        raise _Bad(f"output_throughput ({output:g}) exceeds total_token_throughput ({total:g})")

    key, v = _first(data, "max_concurrency")
    conc = _int(v) if key else None
    from_name = name_concurrency(stem)
    if key and conc is None and v is not None:
        raise _Bad(f"{key} is not an integer ({v!r})")
    if conc is None:
        conc = from_name
    elif from_name is not None and from_name != conc:
        notes.append(Note(path, f"the file name says concurrency {from_name}, {key} says {conc}; using {conc}"))
    if conc is None or conc <= 0:
        raise _Bad("no concurrency: max_concurrency is missing or null and the file name has none")

    completed = _int(data.get("completed"))
    failed, failed_derived = _int(data.get("failed")), False
    num_prompts = _int(data.get("num_prompts"))
    if failed is None and completed is not None and num_prompts is not None and num_prompts >= completed:
        failed, failed_derived = num_prompts - completed, True

    # GPUs: the metadata's working GPUs, else the file name as InferenceX's workflow reads it.
    g, c, d = name_gpus(stem)
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
        pi, po = _path_isl_osl(path, run_root)
        isl, osl = isl if isl is not None else pi, osl if osl is not None else po

    rate = data.get("request_rate")
    if rate is None:
        rate = _last_match(_RATE, stem)
    source = _source(path, data, run_root)
    verdict, reasons = _validity(md, source == "pdbench")
    model = _first(data, "model_id")[1]
    fp = md.get("recipe_fingerprint") or data.get("recipe_fingerprint")
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
        verdict=verdict,
        ttft_breakdown=data["ttft_breakdown"] if isinstance(data.get("ttft_breakdown"), dict) else None,
    )


def _not_a_result(path: Path) -> str | None:
    name = path.name
    if name.endswith(".pytorch.json"):
        return "PyTorch-benchmark sidecar of a result, not a result"
    if name.startswith("benchmark-rollup"):
        return "srt-slurm rollup of the per-point files, not a per-point result"
    if name.startswith("agg_"):
        return "InferenceX-style aggregate (collect output), not a benchmark result"
    if name.startswith("power_validation_"):
        return "InferenceX power-validation sidecar, not a benchmark result"
    return None


def _is_run_dir(path: Path) -> bool:
    return (path / "plan.json").is_file()


def candidate_files(run_path: Path) -> list[Path]:
    """A file argument is itself; a directory gives its *.json files (pdbench's control files
    excepted) and, below it, the files whose names carry a concurrency (srt-slurm nests them in
    logs/sa-bench_*/), without entering other pdbench run directories."""
    if run_path.is_file():
        return [run_path]
    top = sorted(p for p in run_path.glob("*.json") if p.is_file() and p.name not in CONTROL_FILES)
    nested: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(run_path):
        here = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not _is_run_dir(here / n))
        if here != run_path:
            nested += sorted(here / f for f in filenames if looks_like_result_name(f))
    return top + nested


def expand_runs(arg: Path) -> list[Path]:
    """A folder of pdbench runs (results/<recipe>/) without results of its own is its runs."""
    if arg.is_dir() and not _is_run_dir(arg) and not any(arg.glob("*.json")):
        runs = sorted(p for p in arg.iterdir() if p.is_dir() and _is_run_dir(p))
        if runs:
            return runs
    return [arg]


def _label(run_path: Path, points: list[Point]) -> str:
    recipe = next((p.metadata.get("recipe") for p in points if p.metadata.get("recipe")), None)
    if recipe and run_path.parent.name == recipe:
        return f"{recipe}/{run_path.name}"
    return run_path.name


def load_runs(run_paths: list[Path]) -> Loaded:
    """Read every run; `Loaded.skipped` has each file not used and why."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    notes: list[Note] = []
    seen: dict[Path, Run] = {}
    args: list[Path] = []
    for given in run_paths:
        if not given.exists():
            raise RunPathError(f"{given}: no such run directory or result file")
        expanded = expand_runs(given)
        if expanded != [given]:
            notes.append(
                Note(given, f"a folder of runs: read as {len(expanded)} run{'' if len(expanded) == 1 else 's'}")
            )
        args += expanded
    for arg in args:
        resolved = arg.resolve()
        if resolved in seen:
            notes.append(Note(arg, "given more than once; read once"))
            continue
        run_root = arg if arg.is_dir() else arg.parent
        status = None
        status_file = run_root / "status.json"
        if status_file.is_file():
            try:
                status = json.loads(status_file.read_text())
                if not isinstance(status, dict):
                    raise ValueError("not an object")
            except (OSError, ValueError) as e:
                skipped.append(Skipped(status_file, f"status.json unreadable ({e}); run state unknown"))
                status = None
        points: list[Point] = []
        files = candidate_files(arg)
        for f in files:
            reason = _not_a_result(f)
            if reason:
                skipped.append(Skipped(f, reason))
                continue
            try:
                points.append(read_point(f, run_root, notes))
            except _Bad as e:
                skipped.append(Skipped(f, str(e)))
        if not files:
            skipped.append(Skipped(arg, "no result files (*.json) in this run directory"))
        run = Run(
            path=arg,
            label=_label(run_root, points),
            status=status,
            is_pdbench_run=(run_root / "plan.json").is_file(),
            points=points,
        )
        seen[resolved] = run
        runs.append(run)
    labels: dict[str, int] = {}
    for run in runs:
        n = labels.get(run.label, 0) + 1
        labels[run.label] = n
        if n > 1:
            run.label = f"{run.label} ({n})"
    return Loaded(runs=runs, skipped=skipped, notes=notes)


def serving(p: Point) -> str:
    """ "agg" for an aggregated point (metadata.disagg false: a baseline), else "disagg"."""
    return "agg" if p.metadata.get("disagg") is False else "disagg"


def dedupe_key(run: Run, p: Point) -> tuple[Any, ...]:
    """The point identity of `collect` and of a report row: run, recipe fingerprint, serving kind
    (a run holds a disaggregated sweep and its aggregated baseline), ISL, OSL, conc."""
    return (str(run.path.resolve()), p.fingerprint, serving(p), p.isl, p.osl, p.concurrency)


def dedupe(loaded: Loaded) -> None:
    """Keep one point of each identity, the one with the shortest file name (the bench's own name
    rather than a CI runner's prefixed copy); list the others as skipped duplicates."""
    for run in loaded.runs:
        kept: dict[tuple[Any, ...], Point] = {}
        for p in sorted(run.points, key=lambda p: (len(p.path.name), p.path.name)):
            k = dedupe_key(run, p)
            if k in kept:
                loaded.skipped.append(
                    Skipped(
                        p.path,
                        f"duplicate of {kept[k].path.name} (same run, recipe fingerprint, serving, ISL, OSL and concurrency)",
                    )
                )
            else:
                kept[k] = p
        keep = {id(p) for p in kept.values()}
        run.points = [p for p in run.points if id(p) in keep]
