"""What a result file's name says: pdbench's own names through their one owner (harness.rundir's
ResultName), and the names of the other tools the report reads.

Other tools: srt-slurm's `results_concurrency_<C>_gpus_<G>[_ctx_<P>_gen_<D>]` and
`_conc<N>_gpus_<G>...`, InferenceX's RESULT_FILENAME prefix before a pdbench-like tail, vLLM's
`...-concurrency<C>-...`, and the ISL/OSL of a folder such as srt-slurm's
`logs/sa-bench_isl_<I>_osl_<O>/`. The name is the fallback: a file's own keys and metadata win
where they are present.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.rundir import ResultName
from harness.rundir.result_name import rate_label

# Other tools' names that carry a sweep point (used to find results in nested folders, e.g.
# srt-slurm's logs/sa-bench_isl_<I>_osl_<O>/), and the parts of a name that carry the GPU split.
_CONC_PATTERNS = (
    re.compile(r"concurrency_?(\d+)(?=[_.-]|$)"),
    re.compile(r"(?:^|_)conc_?(\d+)(?=[_.]|$)"),
    re.compile(r"(?:^|_)c(\d+)(?=_gpus_)"),
)
_GPUS = re.compile(r"_gpus_(\d+)(?=[_.]|$)")
_CTX = re.compile(r"_ctx_(\d+)(?=[_.]|$)")
_GEN = re.compile(r"_gen_(\d+)(?=[_.]|$)")
ISL_OSL = re.compile(r"(?:^|[_-])isl_?(\d+)_osl_?(\d+)(?=[_.-]|$)")
_RATE = re.compile(r"req_rate_(inf|\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class NameParts:
    concurrency: int | None = None
    rate: str | None = None
    gpus: int | None = None  # the name's `_gpus_<N>`: every GPU of the point
    ctx: int | None = None  # prefill GPUs
    gen: int | None = None  # decode GPUs
    isl: int | None = None
    osl: int | None = None


def _last_match(pattern: re.Pattern[str], name: str) -> str | None:
    found = pattern.findall(name)
    return found[-1] if found else None


def _int(text: str | None) -> int | None:
    return int(text) if text else None


def _isl_osl(text: str) -> tuple[int | None, int | None]:
    m = ISL_OSL.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _pdbench(name: ResultName) -> NameParts:
    split = name.prefill_gpus is not None and name.decode_gpus is not None
    isl, osl = _isl_osl(name.shape) if name.shape else (None, None)
    return NameParts(
        concurrency=name.concurrency,
        rate=rate_label(name.request_rate),
        gpus=(name.prefill_gpus or 0) + (name.decode_gpus or 0) if split else name.gpus,
        ctx=name.prefill_gpus,
        gen=name.decode_gpus,
        isl=isl,
        osl=osl,
    )


def _other_tool(stem: str) -> NameParts:
    conc = next((int(m) for p in _CONC_PATTERNS if (m := _last_match(p, stem)) is not None), None)
    g, c, d = (_last_match(p, stem) for p in (_GPUS, _CTX, _GEN))
    isl, osl = _isl_osl(stem)
    return NameParts(conc, _last_match(_RATE, stem), _int(g), _int(c), _int(d), isl, osl)


def parse_name(stem: str) -> NameParts:
    """The parts of a result file's name (without .json); fields the name lacks are None."""
    own = ResultName.parse(stem)
    return _pdbench(own) if own is not None else _other_tool(stem)


def name_concurrency(name: str) -> int | None:
    return parse_name(name).concurrency


def name_gpus(name: str) -> tuple[int | None, int | None, int | None]:
    """(total, ctx, gen) from `_gpus_<N>[_ctx_<P>_gen_<D>]`, as InferenceX's workflow reads them."""
    parts = parse_name(name)
    return parts.gpus, parts.ctx, parts.gen


def looks_like_result_name(name: str) -> bool:
    return name.endswith(".json") and name_concurrency(name[:-5]) is not None


def is_srt_slurm_name(name: str) -> bool:
    return name.startswith("results_concurrency_") or re.search(r"_conc\d", name) is not None
