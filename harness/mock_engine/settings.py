"""The mock engine's settings and its latency distributions."""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from harness.strict import Strict

Role = Literal["prefill", "decode", "both"]


# -- latency distributions ---------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    """A latency distribution in milliseconds, parsed from `KIND[:A[,B]]`.

    constant:M (or just M), normal:MEAN,STD (clipped at 0), exponential:MEAN,
    uniform:LOW,HIGH, lognormal:MEAN,STD (of the latency itself, not of its log).
    """

    kind: Literal["constant", "normal", "exponential", "uniform", "lognormal"]
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str | float | int) -> Distribution:
        if isinstance(spec, (int, float)):
            return cls._make("constant", [float(spec)], str(spec))
        text = str(spec).strip()
        kind, _, args = text.partition(":") if ":" in text else ("constant", "", text)
        try:
            values = [float(x) for x in args.split(",")] if args.strip() else []
        except ValueError:
            raise ValueError(f"bad latency distribution {text!r}: arguments must be numbers") from None
        return cls._make(kind.strip().lower(), values, text)

    @classmethod
    def _make(cls, kind: str, v: list[float], text: str) -> Distribution:
        arity = {"constant": 1, "exponential": 1, "normal": 2, "uniform": 2, "lognormal": 2}
        if kind not in arity:
            raise ValueError(f"bad latency distribution {text!r}: kind must be one of {', '.join(arity)}")
        if len(v) != arity[kind]:
            raise ValueError(f"bad latency distribution {text!r}: {kind} takes {arity[kind]} number(s)")
        if any(not math.isfinite(x) or x < 0 for x in v):
            raise ValueError(f"bad latency distribution {text!r}: values must be finite and >= 0")
        if kind == "uniform" and v[1] < v[0]:
            raise ValueError(f"bad latency distribution {text!r}: uniform needs LOW <= HIGH")
        if kind == "lognormal" and v[0] == 0 and v[1] > 0:
            raise ValueError(f"bad latency distribution {text!r}: lognormal needs MEAN > 0")
        return cls(kind, v[0], v[1] if len(v) > 1 else 0.0)  # type: ignore[arg-type]

    def __str__(self) -> str:
        two = self.kind in ("normal", "uniform", "lognormal")
        return f"{self.kind}:{self.a:g}" + (f",{self.b:g}" if two else "")

    @property
    def is_zero(self) -> bool:
        return (self.kind in ("constant", "exponential") and self.a == 0) or (
            self.kind in ("uniform", "normal", "lognormal") and self.a == 0 and self.b == 0
        )

    def sample_s(self, rng: random.Random) -> float:
        """One latency in seconds."""
        k, a, b = self.kind, self.a, self.b
        if k == "constant":
            ms = a
        elif k == "normal":
            ms = max(0.0, rng.gauss(a, b))
        elif k == "exponential":
            ms = rng.expovariate(1.0 / a) if a > 0 else 0.0
        elif k == "uniform":
            ms = rng.uniform(a, b)
        else:  # lognormal with the given mean and std of the latency
            if b == 0:
                ms = a
            else:
                sigma2 = math.log1p((b / a) ** 2)
                ms = rng.lognormvariate(math.log(a) - sigma2 / 2, math.sqrt(sigma2))
        return ms / 1000.0


def _distribution_spec(v: Any) -> str:
    return str(Distribution.parse(v))


# -- configuration -----------------------------------------------------------


class MockEngineConfig(Strict):
    """Everything `build_app`/`serve` need; every field has a default."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    model: str = Field("mock", min_length=1)
    ttft_ms: str = Field("0", description="time to first token: a Distribution spec, e.g. 50 or normal:50,5")
    itl_ms: str = Field("0", description="gap between tokens: a Distribution spec")
    role: Role = "both"
    # Without ignore_eos a request stops (finish_reason "stop") after this many tokens;
    # None: the mock never emits EOS, so max_tokens always decides.
    eos_after: PositiveInt | None = None
    default_max_tokens: PositiveInt = 16  # OpenAI's default when a request sets none
    max_model_len: PositiveInt | None = None  # prompt + max_tokens above it: HTTP 400, as vLLM
    tokenizer: str | None = None  # count tokens with this HF tokenizer instead of words
    seed: NonNegativeInt | None = 0  # None: latencies differ from run to run
    engine_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    kv_host: str | None = None  # remote_host in kv_transfer_params; None: host (or 127.0.0.1)
    kv_port: int = Field(5600, ge=0, le=65535)  # vLLM's default NIXL side-channel port
    block_size: PositiveInt = 16
    # At most this many requests served at once (vLLM's max_num_seqs); the rest wait in arrival
    # order and their latencies count from admission: the queueing a model of serving must predict.
    # None: every request is served at once.
    max_num_seqs: PositiveInt | None = None

    _ttft: Distribution
    _itl: Distribution

    @field_validator("ttft_ms", "itl_ms", mode="before")
    @classmethod
    def _check_distribution(cls, v: Any) -> str:
        return _distribution_spec(v)

    def model_post_init(self, __context: Any) -> None:
        self._ttft = Distribution.parse(self.ttft_ms)
        self._itl = Distribution.parse(self.itl_ms)

    @property
    def ttft(self) -> Distribution:
        return self._ttft

    @property
    def itl(self) -> Distribution:
        return self._itl

    @property
    def advertised_kv_host(self) -> str:
        if self.kv_host:
            return self.kv_host
        return "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host


# -- the engine --------------------------------------------------------------
