"""Which client measures a job's sweep, and the settings of the other clients a job can run
(aiperf, `vllm bench serve`) against the same proxy, inside `pdbench bench`.

`benchmark.client` picks the client whose numbers are the sweep's; `benchmark.cross_check`
lists clients that measure the same servers afterwards, at the same concurrencies, so their
numbers stand beside pdbench's in the report. The external clients' command lines are built
by harness.bench.external from these settings and the sweep's own (isl, osl, concurrency,
dataset), so a cross-check sends the same shape of load.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from harness.strict import Strict

ClientName = Literal["pdbench", "aiperf", "vllm"]
ExternalClient = Literal["aiperf", "vllm"]

# The pdbench datasets each external client can send as pdbench would (same lengths or the
# same trace); anything else has no equivalent there and is refused at load.
AIPERF_DATASETS = ("random", "sessions", "mooncake_trace")
VLLM_DATASETS = ("random", "sharegpt")

# Where scripts/setup.sh puts aiperf: its own virtual environment (its pins conflict with vLLM's).
AIPERF_VENV = ".venv-aiperf"


class AiperfSettings(Strict):
    """aiperf (PyPI `aiperf`, run from its own virtual environment as InferenceX does)."""

    executable: str = Field(
        f"{AIPERF_VENV}/bin/aiperf",
        description="aiperf's command: an absolute path, or a path relative to pdbench's own checkout, where "
        "scripts/setup.sh creates .venv-aiperf (unless PDBENCH_NO_AIPERF is set).",
    )
    scenario: str | None = Field(
        None,
        description="aiperf --scenario, which locks a named benchmark's invariants: InferenceX's agentic "
        "coding runs `inferencex-agentx-mvp` (with a Weka trace: public_dataset or weka_trace); null: none.",
    )
    public_dataset: str | None = Field(
        None,
        description="aiperf --public-dataset: a trace source aiperf downloads (InferenceX: "
        "semianalysis_cc_traces_weka_062126_256k; needs the network); null: weka_trace or the sweep's dataset.",
    )
    weka_trace: str | None = Field(
        None,
        description="A local agentic trace in the Weka KV-cache-tester format (a JSON file or a directory of "
        "them; aiperf --custom-dataset-type weka_trace), e.g. the one InferenceX downloads; null: public_dataset "
        "or the sweep's own dataset (random lengths, sessions as multi-turn conversations, the mooncake_trace file).",
    )
    benchmark_duration_s: PositiveFloat | None = Field(
        None,
        description="aiperf --benchmark-duration per point (a trace source needs one; under 900 s InferenceX's "
        "scenario runs with --unsafe-override, marked not a valid submission); null: the sweep's requests per point.",
    )
    extra_args: list[str] = Field(default_factory=list, description="More aiperf profile arguments, appended as given.")
    timeout_s: PositiveFloat = Field(
        1800.0, description="Seconds one aiperf run (one concurrency point) may take before it is stopped."
    )

    @field_validator("executable")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the aiperf executable may not be empty")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> AiperfSettings:
        if self.public_dataset is not None and self.weka_trace is not None:
            raise ValueError("public_dataset, weka_trace: give one trace source, not both")
        if self.scenario is not None and self.trace_source is None:
            raise ValueError(f"scenario {self.scenario!r} replays a trace: set public_dataset or weka_trace")
        if self.trace_source is not None and self.benchmark_duration_s is None:
            raise ValueError("benchmark_duration_s: a trace source is replayed for a duration; set one")
        return self

    @property
    def trace_source(self) -> str | None:
        """The agentic trace aiperf replays instead of the sweep's dataset, if any."""
        return self.public_dataset or self.weka_trace


class VllmBenchSettings(Strict):
    """`vllm bench serve`, from the vLLM install beside pdbench."""

    executable: str = Field(
        "vllm",
        description="The `vllm` command: a bare name is looked up beside pdbench's Python first, then on "
        "PATH; or a path.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="More `vllm bench serve` arguments, appended as given."
    )
    timeout_s: PositiveFloat = Field(
        1800.0, description="Seconds one `vllm bench serve` run (one concurrency point) may take."
    )
    num_prompts: PositiveInt | None = Field(
        None, description="Requests per point; null: as many as pdbench's point measures."
    )

    @field_validator("executable")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the vllm executable may not be empty")
        return v


def check_clients(
    client: ClientName,
    cross_check: list[ExternalClient],
    dataset: str,
    shaped: bool,
    trace_source: str | None,
) -> None:
    """Raise ValueError naming the field when the clients asked for cannot send this sweep's load."""
    if len(set(cross_check)) != len(cross_check):
        raise ValueError(f"cross_check: a client is named twice ({', '.join(cross_check)})")
    if client in cross_check:
        raise ValueError(f"cross_check: {client!r} is already the sweep's client (benchmark.client)")
    used = ([client] if client != "pdbench" else []) + list(cross_check)
    field = {c: ("client" if c == client else "cross_check") for c in used}
    if "vllm" in used:
        if dataset not in VLLM_DATASETS:
            raise ValueError(
                f"{field['vllm']}: `vllm bench serve` cannot send dataset {dataset!r} as pdbench does "
                f"(it can: {', '.join(VLLM_DATASETS)})"
            )
        if shaped:
            raise ValueError(f"{field['vllm']}: `vllm bench serve` takes one isl/osl, not shapes")
    if "aiperf" in used:
        if trace_source is None and dataset not in AIPERF_DATASETS:
            raise ValueError(
                f"{field['aiperf']}: aiperf cannot send dataset {dataset!r} as pdbench does (it can: "
                f"{', '.join(AIPERF_DATASETS)}; or give it a trace: aiperf.public_dataset or aiperf.weka_trace)"
            )
        if shaped and trace_source is None:
            raise ValueError(f"{field['aiperf']}: aiperf takes one isl/osl, not shapes")
