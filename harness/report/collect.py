"""`pdbench collect`: the InferenceX-style aggregate, one entry per point.

Keys and formulas follow InferenceX's `utils/process_result.py` (multinode, disaggregated branch):
per-role GPU normalisation (total over P+D, output over D, or over P+D when D is 0, input over P),
every `*ms` latency as seconds under its name without `_ms`, and each `tpot` key also as
`*_intvty = 1000 / value` (tokens/s/user). What InferenceX takes from its CI environment
(RUNNER_TYPE, PRECISION, PREFILL_TP, ...) comes from each result's pdbench metadata block;
only the hardware name is not there (`--hw`, or RUNNER_TYPE as in InferenceX's CI).

Entries are validated and deduplicated by run, recipe fingerprint, ISL, OSL and concurrency. Only
points with a "valid" verdict are kept by default: invalid ones (`metadata.valid: false`) and
unverified ones (no evidence either way: `metadata.valid: null`, `metadata.validity.verdict:
"unverified"`, or no verdict at all) only when asked for; they then carry `"validity": "invalid"`
(and `"valid": false`) or `"validity": "unverified"`, keys InferenceX's schema does not have.
tests/report/test_inferencex_contract.py checks every entry against what process_result.py computes from
the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import atomic
from harness.report.collect_entry import CollectEntry
from harness.report.load import dedupe, load_runs
from harness.report.normalise import per_gpu
from harness.report.points import Point, Skipped


@dataclass
class Collected:
    entries: list[dict[str, Any]]
    skipped: list[Skipped]
    notes: list[str] = field(default_factory=list)


class _Skip(Exception):
    pass


def _meta(md: dict[str, Any], key: str) -> Any:
    if md.get(key) is None:
        raise _Skip(
            f"metadata.{key} is missing; collect needs pdbench's metadata block for topology, precision and model"
        )
    return md[key]


def _flag(v: Any) -> str:
    """InferenceX carries dp-attention as the workflow's text, 'true' or 'false'."""
    return "true" if v is True or str(v).lower() == "true" else "false"


NO_HW = "hardware unknown (no hw in its metadata, none given)"


def entry(p: Point, hw: str | None, notes: list[str]) -> CollectEntry:
    md = p.metadata
    if not md:
        raise _Skip("no pdbench metadata block (collect needs the point's topology, precision and model)")
    baseline = md.get("disagg") is False
    if baseline and (md.get("gpus") is None or md.get("tp") is None):
        raise _Skip(
            "not a disaggregated point (metadata.disagg is false) and not a pdbench aggregated baseline "
            "(no metadata gpus/tp); InferenceX's process_result.py takes the file itself: single-node "
            "branch, or multinode with the `_gpus_N` of its name counted as prefill"
        )
    hw = hw or md.get("hw") or md.get("runner_type")
    if not hw:
        raise _Skip(NO_HW)
    if p.isl is None or p.osl is None:
        raise _Skip("ISL/OSL unknown")
    prefill, decode = p.prefill_gpus, p.decode_gpus
    if baseline:
        # An aggregated baseline as InferenceX's multinode workflow reads its `_gpus_N` file:
        # N GPUs of prefill-only workers, none of decode (the same per-GPU figures as its
        # single-node branch with TP = N).
        prefill, decode = int(md["gpus"]), 0
        md = md | {
            "prefill_tp": md["tp"],
            "prefill_ep": md.get("ep") or 1,
            "prefill_dp_attention": md.get("dp_attention"),
            "prefill_num_workers": md.get("num_workers") or 1,
            "decode_num_workers": 0,
        }
    if prefill is None or decode is None:
        raise _Skip("GPU split unknown (no metadata prefill_gpus/decode_gpus, no _gpus_ in the file name)")
    if prefill <= 0:
        raise _Skip("no prefill GPU: InferenceX's multinode results need at least one")
    tput, out, inp = per_gpu(p.total_token_throughput, p.output_throughput, prefill, decode)
    router = None
    if md.get("proxy") == "pdbench" and md.get("pdbench_version"):
        router = {"name": "pdbench", "version": str(md["pdbench_version"])}
    elif md.get("proxy") and md.get("proxy_version"):
        router = {"name": str(md["proxy"]), "version": str(md["proxy_version"])}
    has_decode = decode > 0
    data: dict[str, Any] = {
        "hw": hw,
        "conc": p.concurrency,
        "image": md.get("image") or "",
        "model": p.model or _meta(md, "model"),
        "infmax_model_prefix": md.get("model_prefix") or _meta(md, "model"),
        "framework": md.get("framework") or "vllm-disagg",
        "precision": _meta(md, "precision"),
        "spec_decoding": md.get("spec_decoding") or "none",
        "disagg": not baseline,
        "recipe_fingerprint": p.fingerprint or "",
        "isl": p.isl,
        "osl": p.osl,
        "router": router,
        "kv_p2p_transfer": None if baseline else md.get("connector") or None,
        "is_multinode": True,
        "prefill_tp": _meta(md, "prefill_tp"),
        "prefill_pp": md.get("prefill_pp") or 1,
        "prefill_dcp_size": md.get("prefill_dcp_size") or 1,
        "prefill_pcp_size": md.get("prefill_pcp_size") or 1,
        "prefill_ep": _meta(md, "prefill_ep"),
        "prefill_dp_attention": _flag(md.get("prefill_dp_attention")),
        "prefill_num_workers": _meta(md, "prefill_num_workers"),
        # InferenceX zeroes decode's parallelism when there is no decode GPU.
        "decode_tp": _meta(md, "decode_tp") if has_decode else 0,
        "decode_pp": (md.get("decode_pp") or 1) if has_decode else 1,
        "decode_dcp_size": (md.get("decode_dcp_size") or 1) if has_decode else 1,
        "decode_pcp_size": (md.get("decode_pcp_size") or 1) if has_decode else 1,
        "decode_ep": _meta(md, "decode_ep") if has_decode else 0,
        "decode_dp_attention": _flag(md.get("decode_dp_attention")),
        "decode_num_workers": _meta(md, "decode_num_workers"),
        "num_prefill_gpu": prefill,
        "num_decode_gpu": decode,
        "tput_per_gpu": tput,
        "output_tput_per_gpu": out,
        "input_tput_per_gpu": inp,
    }
    for key, value in p.ms.items():  # file order, as InferenceX iterates the result
        if key.endswith("ms"):
            data[key.replace("_ms", "")] = value / 1000.0
        if "tpot" in key:
            name = key.replace("_ms", "").replace("tpot", "intvty")
            if value > 0:
                data[name] = 1000.0 / value
            else:
                notes.append(f"{p.path}: {key} is {value:g}; {name} left out (1000 / 0)")
    if p.verdict == "invalid":
        data |= {"valid": False, "validity": "invalid"}
    elif p.verdict == "unverified":
        data["validity"] = "unverified"
    try:
        return CollectEntry.model_validate(data)
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'entry'}: {err['msg']}" for err in e.errors())
        raise _Skip(f"entry fails validation: {errors}") from None


def collect(
    run_paths: list[Path], hw: str | None = None, include_invalid: bool = False, include_unverified: bool = False
) -> Collected:
    loaded = load_runs(run_paths)
    dedupe(loaded)
    result = Collected(entries=[], skipped=list(loaded.skipped), notes=[f"{n.path}: {n.text}" for n in loaded.notes])
    for run in loaded.runs:
        if run.status is not None and run.status.get("state") != "succeeded":
            result.notes.append(
                f"{run.path}: run state {run.status.get('state')}; its result files are collected all the same"
            )
        points = sorted(run.points, key=lambda p: (p.isl or 0, p.osl or 0, p.concurrency))
        for p in points:
            why = "; ".join(p.validity_reasons) or "no reason given"
            notes: list[str] = []
            try:
                e = entry(p, hw, notes)  # first: a file collect cannot write at all says so
                if p.verdict == "invalid" and not include_invalid:
                    raise _Skip(f"invalid point (metadata.valid is false: {why}); --include-invalid keeps it")
                if p.verdict == "unverified" and not include_unverified:
                    raise _Skip(
                        f"unverified point (no evidence it measured what it claims: {why}); "
                        f"--include-unverified keeps it"
                    )
            except _Skip as err:
                result.skipped.append(Skipped(p.path, str(err)))
                continue
            if p.stop_reason:
                notes.insert(0, f"{p.path}: ended before every request was done ({p.stop_reason}); collected")
            result.notes += notes
            result.entries.append(e.dump())
    no_hw = sum(s.reason == NO_HW for s in result.skipped)
    if no_hw:  # once, not per point: what to pass
        result.notes.append(
            f"{no_hw} point(s) have no hardware name: pass --hw NAME (InferenceX's RUNNER_TYPE, "
            "e.g. --hw h100-disagg, or set RUNNER_TYPE) to collect them"
        )
    return result


def write_new(path: Path, entries: list[dict[str, Any]]) -> Path:
    """Create `path` with the JSON array, atomically and only if it does not exist yet."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        raise FileExistsError(f"{path} exists; collect never overwrites (choose another --out)")
    try:
        return atomic.write_json(path, entries, indent=2, replace=False)  # never replaces one created meanwhile
    except FileExistsError:
        raise FileExistsError(f"{path} exists; collect never overwrites (choose another --out)") from None
