"""What a result file's name says, in the naming of every tool the report reads.

pdbench's `concurrency_<C>_req_rate_<R>[_isl_<I>_osl_<O>]_gpus_<P+D>_ctx_<P>_gen_<D>`, srt-slurm's
`results_concurrency_<C>_gpus_<G>[_ctx_<P>_gen_<D>]` and `_conc<N>_gpus_<G>...`, and the ISL/OSL of
a folder such as srt-slurm's `logs/sa-bench_isl_<I>_osl_<O>/`. The name is the fallback: a file's
own keys and metadata win where they are present.
"""

from __future__ import annotations

import re

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
ISL_OSL = re.compile(r"(?:^|[_-])isl_?(\d+)_osl_?(\d+)(?=[_.-]|$)")
_RATE = re.compile(r"req_rate_(inf|\d+(?:\.\d+)?)")


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


def name_rate(name: str) -> str | None:
    return _last_match(_RATE, name)


def looks_like_result_name(name: str) -> bool:
    return name.endswith(".json") and name_concurrency(name[:-5]) is not None


def is_srt_slurm_name(name: str) -> bool:
    return name.startswith("results_concurrency_") or re.search(r"_conc\d", name) is not None
