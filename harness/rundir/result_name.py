"""The name of a pdbench result file, built and parsed in one place.

`concurrency_<C>_req_rate_<R>[_isl_<I>_osl_<O>][_gpus_<P+D>_ctx_<P>_gen_<D> | _gpus_<N>].json`:
the shape appears in a several-shape sweep; the GPU split is what InferenceX's workflow parses
from the name (`_gpus_<N>` alone: one aggregated server counting all N as the one worker's;
nothing: the split is unknown and its workflow skips the file rather than invent per-GPU figures).
A point's /metrics evidence lives in a folder named by `point_tag` (the name up to the shape).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

_NAME = re.compile(
    r"concurrency_(?P<c>\d+)_req_rate_(?P<rate>inf|\d+(?:\.\d+)?)"
    r"(?:_(?P<shape>isl_\d+_osl_\d+))?"
    r"(?:_gpus_(?P<gpus>\d+)(?:_ctx_(?P<ctx>\d+)_gen_(?P<gen>\d+))?)?"
)

_SHAPE = re.compile(r"isl_(\d+)_osl_(\d+)")


def rate_label(request_rate: float) -> str:
    if math.isinf(request_rate):
        return "inf"
    return str(int(request_rate)) if request_rate.is_integer() else str(request_rate)


def shape_tag(isl: int, osl: int) -> str:
    return f"isl_{isl}_osl_{osl}"


@dataclass(frozen=True)
class ResultName:
    concurrency: int
    request_rate: float
    shape: str | None = None  # shape_tag(isl, osl) in a several-shape sweep
    prefill_gpus: int | None = None
    decode_gpus: int | None = None
    gpus: int | None = None  # one aggregated server's GPUs (when the P/D split does not apply)

    GLOB: ClassVar[str] = "concurrency_*.json"
    TEMPLATE: ClassVar[str] = "concurrency_<C>_req_rate_<R>[_isl_<I>_osl_<O>]_gpus_<P+D>_ctx_<P>_gen_<D>.json"

    @property
    def isl_osl(self) -> tuple[int, int] | None:
        """The shape's input and output lengths, when the name carries a shape."""
        if self.shape is None:
            return None
        isl, osl = _SHAPE.fullmatch(self.shape).groups()  # type: ignore[union-attr]  # parse() checked it
        return int(isl), int(osl)

    @property
    def point_tag(self) -> str:
        """The point's folder name for its /metrics evidence: `concurrency_<C>[_isl_<I>_osl_<O>]`."""
        return point_tag(self.concurrency, self.shape)

    @property
    def filename(self) -> str:
        name = f"concurrency_{self.concurrency}_req_rate_{rate_label(self.request_rate)}"
        if self.shape is not None:
            name += f"_{self.shape}"
        if self.prefill_gpus is not None and self.decode_gpus is not None:
            name += f"_gpus_{self.prefill_gpus + self.decode_gpus}_ctx_{self.prefill_gpus}_gen_{self.decode_gpus}"
        elif self.gpus is not None:
            name += f"_gpus_{self.gpus}"
        return name + ".json"

    @classmethod
    def parse(cls, name: str) -> ResultName | None:
        """The parts of a pdbench result file name (with or without .json); None for any other name."""
        m = _NAME.fullmatch(name.removesuffix(".json"))
        if m is None:
            return None
        num = lambda k: int(m[k]) if m[k] is not None else None  # noqa: E731
        return cls(
            concurrency=int(m["c"]),
            request_rate=math.inf if m["rate"] == "inf" else float(m["rate"]),
            shape=m["shape"],
            prefill_gpus=num("ctx"),
            decode_gpus=num("gen"),
            gpus=num("gpus") if m["ctx"] is None else None,
        )


def point_tag(concurrency: int, shape: str | None = None) -> str:
    return f"concurrency_{concurrency}" + (f"_{shape}" if shape else "")
