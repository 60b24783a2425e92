"""BenchmarkSettings: the one definition of what a benchmark sweep measures (and ValidityThresholds,
how its points are judged: harness.validity applies them).

A recipe's `benchmark:` section is this model; `pdbench bench` takes the same fields as
flags (generated from them, harness.bench.bench_command) and in its --config file (ClientConfig,
which adds where to send the requests and where to write). Nothing else copies a field.

Field metadata that only the CLI needs sits in `json_schema_extra`:
  cli_default  the "[default: ...]" text where the plain default would not say enough
  cli_flags    the option's names where they differ from the field name
  cli_format   how a list or dict is written on the command line ("csv", "repeat", "kv")
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StrictFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from harness.config import workloads as wl
from harness.config.external_clients import (
    AiperfSettings,
    ClientName,
    ExternalClient,
    VllmBenchSettings,
    check_clients,
)
from harness.config.slo import SLOError, check_bounds, result_key
from harness.rundir.power_samples import DEFAULT_INTERVAL_S as POWER_INTERVAL_S
from harness.rundir.result_name import shape_tag
from harness.strict import FrozenStrict, Strict


class ValidityThresholds(BaseModel):
    hit_tolerance: float = Field(0.02, ge=0, le=1, description="share of sent prompt tokens that may miss")
    max_failed_share: float = Field(0.05, ge=0, le=1, description="InferenceX CI's 5 %")
    token_tolerance: float = Field(0.02, ge=0, le=1, description="client vs server token counts")
    early_check_s: float = Field(
        10.0,
        ge=0,
        description="From this many seconds into a point, its evidence is checked at every /metrics sample; "
        "a point already shown invalid (no generated tokens, decode computing the prompt, failed or expired "
        "KV transfers) stops there, its reason recorded. 0: never stop early.",
    )
    # The rule kv_transport (harness.validity.kv_transport; defaults from docs/gpu.md's H200 figures,
    # why in docs/validity.md): a point's KV rate against the ceiling measured in the same job.
    kv_min_ceiling_share: float = Field(
        0.03,
        ge=0,
        le=1,
        description="A disaggregated point whose KV rate (bytes over the transfer time beyond "
        "kv_fixed_cost_ms a transfer, over the transfers of at least kv_judged_min_bytes) is below this share "
        "of the job's measured ceiling (state/kv_ceiling.json: a device-to-device or host copy between "
        "prefill's and decode's devices, or across hosts a TCP transfer between their nodes, at most the NIC's "
        "line rate) is invalid: degraded_transport. 0: never judged.",
    )
    kv_fixed_cost_ms: NonNegativeFloat = Field(
        20.0,
        description="The time per KV transfer the connector may spend beyond moving its bytes (handshake, "
        "posting, notification); the rate is judged on the rest of each transfer's time.",
    )
    kv_judged_min_bytes: NonNegativeInt = Field(
        64 << 20,
        description="Only KV transfers of at least this many bytes are judged against the ceiling (NIXL: the "
        "point's mean transfer); smaller ones are bound by latency, not the lane.",
    )
    on_early_invalid: Literal["next_point", "stop_sweep"] = Field(
        "next_point",
        description="After a point stopped early: go on with the next point (the job still fails at the end, "
        "as for any invalid point), or run no more points (stop_sweep).",
    )
    # Left out of the lock (and the fingerprint) at their defaults.
    power_interval_s: NonNegativeFloat = Field(
        POWER_INTERVAL_S,
        exclude_if=lambda v: v == POWER_INTERVAL_S,
        description="Seconds between GPU power samples on every node (0.05 to 2: InferenceX refuses gaps over "
        "3 s); 0: no power sampler, each point's power is recorded as off.",
    )
    require_power: bool = Field(
        False,
        exclude_if=lambda v: not v,
        description="Fail the job when a point's GPU power is missing or invalid (InferenceX's REQUIRE_POWER: "
        "a power study); otherwise such a point's power record says why and the job goes on.",
    )

    @field_validator("power_interval_s")
    @classmethod
    def _power_interval(cls, v: float) -> float:
        if v and not 0.05 <= v <= 2.0:
            raise ValueError(f"must be 0 (off) or from 0.05 to 2 s, got {v}")
        return v


class SentinelSettings(Strict):
    """Greedy requests mixed into every point whose answers are known from a path that does not
    disaggregate (harness.bench.sentinels); the validity rule outputs_match judges them."""

    enabled: bool = Field(True, description="Mix sentinel prompts into every point.")
    share: float = Field(
        0.02, ge=0, le=0.5, description="Sentinels per point as a share of the point's measured requests."
    )
    min_per_point: NonNegativeInt = Field(4, description="At least this many sentinels in every point.")
    match_tokens: PositiveInt | None = Field(
        None,
        description="Tolerance: a sentinel matches when its first N tokens equal the reference's; null: every "
        "token must (deterministic hardware, e.g. CPU float32). GPUs' batch-dependent floating point can make "
        "a correct deployment's greedy outputs part late in a long answer (docs/output-checks.md).",
    )
    max_diverged: NonNegativeInt = Field(
        0, description="Sentinels of one point that may diverge beyond match_tokens before the point is invalid."
    )
    reference: Literal["prefill", "decode"] = Field(
        "prefill",
        description="Which server answers the sentinels whole, before the sweep: the phase's first prefill, or its "
        "first decode (asked with a cache_salt of its own, so that decode's prefix cache cannot serve the "
        "disaggregated sentinels). Decode computes every token a disaggregated request returns, so it is the "
        "reference of its own layout where prefill's differs; it must then prefill whole prompts, which vLLM "
        "0.20's FP8-MLA decode on an H200 could not (docs/output-checks.md).",
    )

    def per_point(self, measured: int) -> int:
        """How many sentinels a point of `measured` requests carries."""
        if not self.enabled:
            return 0
        return max(self.min_per_point, round(self.share * measured))


# An exponential think time is cut at this multiple of its mean, so that one session's pause
# cannot outlast a point's time bound (the mean moves by e^-10 of itself).
THINK_TIME_CAP = 10.0


class SessionSettings(Strict):
    """Multi-turn sessions (dataset `sessions`, harness.bench.sessions): turn k's prompt is the whole
    conversation so far (every earlier prompt and the answer the server actually returned) plus new
    user text, so each later turn shares most of its prompt with the turn before it."""

    turns: PositiveInt = Field(4, description="Turns (requests) per session, each waiting for the one before.")
    user_tokens: PositiveInt | None = Field(
        None,
        description="Tokens of new user text each turn after the first adds to the conversation (spread by "
        "range_ratio as isl is); null: isl. The first turn's prompt is isl tokens; every turn asks for osl.",
    )
    think_time_s: NonNegativeFloat = Field(
        0.0, description="Mean seconds a session waits between an answer and its next turn (0: none)."
    )
    think_time_distribution: Literal["constant", "exponential", "uniform"] = Field(
        "exponential",
        description="Think times: constant (always the mean), exponential (with the mean, cut at 10 x the "
        "mean) or uniform over [0, 2 x mean]; drawn from the seed.",
    )
    num_sessions: PositiveInt | None = Field(
        None,
        description="Measured sessions per point (null: max(4, 2 x concurrency)); the point's concurrency is "
        "the sessions in flight.",
    )
    num_warmup_sessions: NonNegativeInt | None = Field(
        None,
        description="Unmeasured whole sessions per point before the measured ones (null: concurrency).",
    )

    def sessions_for(self, concurrency: int) -> int:
        return self.num_sessions if self.num_sessions is not None else max(4, 2 * concurrency)

    def warmup_sessions_for(self, concurrency: int) -> int:
        return concurrency if self.num_warmup_sessions is None else self.num_warmup_sessions

    @property
    def think_time_max_s(self) -> float:
        """The longest one think time can be (the exponential's tail is cut there)."""
        if self.think_time_distribution == "constant":
            return self.think_time_s
        if self.think_time_distribution == "uniform":
            return 2 * self.think_time_s
        return THINK_TIME_CAP * self.think_time_s


class TraceSettings(Strict):
    """Replay of a Mooncake-format trace (dataset `mooncake_trace`, file dataset_path): JSON lines of
    `timestamp` (ms), `input_length`, `output_length` and `hash_ids` (equal ids: equal token blocks)."""

    speed: PositiveFloat = Field(
        1.0, description="Time factor of the replay: 2.0 sends the trace twice as fast as its timestamps."
    )
    block_tokens: PositiveInt = Field(
        512, description="Tokens per hash id block (the Mooncake trace format's blocks are 512 tokens)."
    )
    max_requests: PositiveInt | None = Field(
        None,
        description="Replay only the trace's first N requests (null: the whole trace).",
    )


class RepeatSettings(Strict):
    """How often an SLO search measures each SLO's best concurrency again (harness.bench.slo_ladder)."""

    max: NonNegativeInt = Field(
        2, description="At most this many more measurements of each SLO's best concurrency (0: none)."
    )
    ci_half_width: PositiveFloat = Field(
        0.03,
        description="Stop repeating once the t-interval's half-width of goodput per device is at most this "
        "share of its mean (it needs two measurements).",
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="Confidence of that t-interval.")


class SloSearchSettings(Strict):
    """An SLO search over the concurrency ladder (harness.bench.slo_ladder): per SLO, climb from
    start by doubling while its bounds are met, bisect the ladder between the last point that met
    them and the first that did not, then measure each SLO's best point again (repeats)."""

    slos: dict[str, dict[str, StrictFloat]] = Field(
        description="Named SLOs, each a map of <metric>_<stat> (ttft, tpot, itl, e2el; p50, mean, p90, p99, "
        "...) to an upper bound in ms. A point meets an SLO when it meets every bound, its verdict is not "
        "invalid and no request failed.",
        examples=[{"tight": {"ttft_p90": 800, "tpot_p90": 40}, "loose": {"ttft_p90": 3000}}],
    )
    start: PositiveInt | None = Field(None, description="The ladder value measured first (null: the first).")
    repeats: RepeatSettings = Field(
        default_factory=RepeatSettings, description="Further measurements of each SLO's best concurrency."
    )

    @model_validator(mode="after")
    def _check_slos(self) -> SloSearchSettings:
        if not self.slos:
            raise ValueError("slos: no SLO given (e.g. tight: {ttft_p90: 800, tpot_p90: 40})")
        checked: dict[str, dict[str, float]] = {}
        for name, bounds in self.slos.items():
            if not name or not name.replace("-", "_").isidentifier():
                raise ValueError(f"slos.{name}: an SLO's name is a word (letters, digits, - and _)")
            try:
                checked[name] = check_bounds(bounds, f"slos.{name}")
            except SLOError as e:
                raise ValueError(str(e)) from None
        self.slos = checked
        return self


ProfileRole = Literal["prefill", "decode", "aggregated"]


class ProfileSettings(Strict):
    """Profiles of the measured window of chosen points on chosen roles (harness.bench.profile,
    docs/profiling.md): the servers of those roles start with vLLM's profiler configured, and the
    sweep calls their /start_profile and /stop_profile around the point's measured requests."""

    roles: list[ProfileRole] = Field(
        default_factory=lambda: list[ProfileRole](["prefill", "decode"]),
        min_length=1,
        description="Roles whose servers are profiled: prefill, decode, or aggregated (an aggregated "
        "instance, as the topology calls it); every instance of a role is profiled.",
    )
    points: list[PositiveInt] = Field(
        min_length=1,
        description="Concurrencies to profile, each one of `concurrency`; the other points get no traces.",
        examples=[[8]],
    )
    tool: Literal["torch", "nsys"] = Field(
        "torch",
        description="torch: vLLM's torch profiler, Chrome-trace JSON per process (runs anywhere); nsys: the "
        "servers run under `nsys profile` with a capture range that the same endpoints start and stop "
        "(vLLM's cuda profiler), one .nsys-rep per capture (GPU sites).",
    )
    perturbation: bool = Field(
        True,
        description="true: the point's measured requests run unprofiled (its result), then a second window "
        "of the same size and shape runs profiled, and the result reports both medians and their ratios; "
        "false: the measured window itself is profiled (half the time; the result then carries the "
        "profiler's cost).",
    )
    max_iterations: PositiveInt | None = Field(
        None,
        description="Engine steps recorded per start at most (vLLM's max_iterations of /start_profile); "
        "null: the whole window. Bounds a trace's size on long windows.",
    )
    profiler_config: dict[str, Any] = Field(
        default_factory=dict,
        description="More keys of vLLM's --profiler-config for the profiled servers (e.g. "
        "torch_profiler_record_shapes: true, torch_profiler_with_stack: false); checked by vLLM's parser "
        "when the job is rendered. `profiler` and `torch_profiler_dir` are pdbench's.",
        examples=[{"torch_profiler_with_stack": False}],
    )
    nsys_args: list[str] = Field(
        default_factory=list,
        description="Extra arguments of `nsys profile` (tool nsys), after pdbench's and before -o.",
        examples=[["--stats=true"]],
    )
    start_timeout_s: PositiveFloat = Field(60.0, description="Seconds one /start_profile call may take.")
    stop_timeout_s: PositiveFloat = Field(
        600.0,
        description="Seconds one /stop_profile call and the trace files' writing may take together (a CPU "
        "trace of a long window takes minutes to write).",
    )

    @field_validator("profiler_config")
    @classmethod
    def _check_profiler_config(cls, v: dict[str, Any]) -> dict[str, Any]:
        if ours := sorted({"profiler", "torch_profiler_dir"} & v.keys()):
            raise ValueError(f"{', '.join(ours)}: set by pdbench from tool and the run directory; leave out")
        return v

    def check_roles(self, served: list[str]) -> None:
        """Raise when a profiled role has no server in the topology (`served`: its roles): such a
        role would be profiled nowhere, said only in the bench log. The recipe's check calls it."""
        if missing := [r for r in self.roles if r not in served]:
            raise ValueError(
                f"benchmark.profile.roles: no server of role {', '.join(missing)} in this topology "
                f"(its servers' roles: {', '.join(served)})"
            )

    @field_validator("roles", "points")
    @classmethod
    def _unique(cls, v: list[Any]) -> list[Any]:
        if len(set(v)) != len(v):
            raise ValueError("each value may appear once")
        return v


ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _cli(**kw: Any) -> dict[str, Any]:
    return kw


# More requests in flight than any serving deployment takes; a bigger number is a typo (each one
# is an open connection of the client, and a point sends 10x as many requests by default).
MAX_CONCURRENCY = 100_000


class Shape(FrozenStrict):
    """One traffic shape of a sweep: prompt and output lengths (and their spread)."""

    isl: PositiveInt = Field(description="Input (prompt) length in tokens.")
    osl: PositiveInt = Field(description="Output length in tokens.")
    range_ratio: float | None = Field(None, description="Length spread of this shape; default: the sweep's.")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, v: Any) -> Any:
        # The short form of the CLI and of --set: "1024x1024" or "8192x1024x0.8".
        if not isinstance(v, str):
            return v
        parts = [p.strip() for p in v.lower().split("x")]
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"expected ISLxOSL or ISLxOSLxRANGE_RATIO (e.g. 1024x1024), got {v!r}")
        return dict(zip(("isl", "osl", "range_ratio"), parts, strict=False))

    @property
    def tag(self) -> str:
        """What names this shape in result files and directories: isl_<I>_osl_<O>."""
        return shape_tag(self.isl, self.osl)


class BenchmarkSettings(Strict):
    # ser_json_inf_nan="strings": an infinite request_rate round-trips through the JSON
    # file a job writes ("Infinity") instead of becoming null.
    model_config = ConfigDict(ser_json_inf_nan="strings")

    isl: PositiveInt | None = Field(
        None,
        description="Input (prompt) length in tokens (or give shapes).",
        examples=[1024],
        json_schema_extra=_cli(cli_default="none; isl and osl, or shapes, are required"),
    )
    osl: PositiveInt | None = Field(
        None,
        description="Output length in tokens (or give shapes).",
        examples=[1024],
        json_schema_extra=_cli(cli_default="none; isl and osl, or shapes, are required"),
    )
    shapes: list[Shape] = Field(
        default_factory=list,
        description="Several (isl, osl[, range_ratio]) shapes instead of isl/osl, each with its own "
        "concurrency sweep against the same servers, in this order; result files then carry "
        "_isl_<I>_osl_<O> in their names. On the command line: ISLxOSL[xRANGE_RATIO].",
        examples=[[{"isl": 1024, "osl": 1024}, {"isl": 8192, "osl": 1024, "range_ratio": 0.8}]],
        json_schema_extra=_cli(cli_format="csv", cli_default="none"),
    )
    range_ratio: float = Field(
        1.0,
        description="Length spread, a fraction: inferencex draws lengths from [r*len, len], "
        "vllm from [(1-r)*len, (1+r)*len].",
        examples=[0.8],
    )
    range_ratio_convention: Literal["inferencex", "vllm"] = Field(
        "inferencex", description="How range_ratio applies: inferencex or vllm."
    )
    concurrency: list[PositiveInt] = Field(
        min_length=1,
        description="Concurrency points of the sweep, one result file each.",
        examples=[[1, 8, 64]],
        json_schema_extra=_cli(cli_format="csv"),
    )
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="API to call: completions (/v1/completions) or chat (/v1/chat/completions)."
    )
    request_rate: PositiveFloat = Field(
        math.inf,
        description="Arrival rate in requests/s; inf sends every request at once (up to the concurrency).",
        json_schema_extra=_cli(cli_default="inf"),
    )
    burstiness: PositiveFloat = Field(
        1.0, description="Gamma shape of arrival gaps at a finite request_rate: 1 Poisson, below 1 burstier."
    )
    num_prompts: PositiveInt | None = Field(
        None,
        description="Measured requests per point.",
        json_schema_extra=_cli(cli_default="max(min_prompts, prompts_multiplier x concurrency)"),
    )
    prompts_multiplier: PositiveInt = Field(
        10, description="Without num_prompts: measured requests per point = this x concurrency."
    )
    min_prompts: PositiveInt = Field(16, description="Without num_prompts: fewest measured requests per point.")
    num_warmups: NonNegativeInt | None = Field(
        None,
        description="Unmeasured warmup requests per point.",
        json_schema_extra=_cli(cli_default="2 x concurrency"),
    )
    cooldown_s: NonNegativeFloat = Field(0.0, description="Seconds to wait between concurrency points.")
    request_timeout_s: PositiveFloat = Field(600.0, description="Seconds allowed for one request.")
    # Not in vLLM: bound on one whole point, so that a stuck server cannot hang a job.
    point_timeout_s: PositiveFloat | None = Field(
        None,
        description="Seconds allowed for a point's warmups, and again for its measured requests.",
        json_schema_extra=_cli(cli_default="derived from request_timeout_s, the requests and the rate"),
    )
    total_timeout_s: PositiveFloat | None = Field(
        None,
        description="Seconds bounding the whole sweep; the running point keeps what finished "
        "(written, with stop_reason) and the points left are not run.",
        json_schema_extra=_cli(cli_default="no bound"),
    )
    workers: PositiveInt | None = Field(
        None,
        description="Load-generator processes (each streams its share of the concurrency; one merged "
        "result per point with exact percentiles). One process streams some tens of thousands of "
        "tokens per second; see each result's client section for whether it was the limit.",
        json_schema_extra=_cli(cli_default="one per 8 cores available, 1 to 16"),
    )
    seed: NonNegativeInt = Field(0, description="Random seed of the prompts and the arrival gaps.")
    ignore_eos: bool = Field(True, description="Ask for exactly osl tokens, past end-of-sequence.")
    percentiles: list[float] = Field(
        default_factory=lambda: [90.0, 99.0, 99.9],
        description="Latency percentiles reported (p<N>_ttft_ms, ...), each within [0, 100].",
        json_schema_extra=_cli(cli_format="csv", cli_default="90,99,99.9"),
    )
    dataset: Literal["random", "jsonl", "sharegpt", "sessions", "mooncake_trace"] = Field(
        "random",
        description="Prompt source: random prompts of exact length (isl/osl/range_ratio); multi-turn "
        "sessions of random text (see sessions); or a file: jsonl (one "
        '{"prompt": str, "output_len": int?} per line), sharegpt (a JSON list of '
        '{"conversations": [{"from", "value"}, ...]}) or mooncake_trace (a Mooncake-format trace, '
        "replayed at its timestamps; see trace).",
        json_schema_extra=_cli(cli_flags=["--dataset", "--dataset-name"]),
    )
    dataset_path: str | None = Field(
        None,
        description="Prompt file for dataset jsonl or sharegpt; the trace for mooncake_trace.",
        json_schema_extra=_cli(cli_default="none"),
    )
    random_prefix_len: NonNegativeInt = Field(
        0,
        description="Tokens of one random prefix shared by every prompt of the sweep, before the "
        "isl-sampled part (vLLM's --random-prefix-len).",
    )
    goodput: dict[Literal["ttft", "tpot", "e2el"], NonNegativeFloat] = Field(
        default_factory=dict,
        description="SLOs in ms for request_goodput, as vLLM's --goodput (keys ttft, tpot, e2el).",
        examples=[{"ttft": 2000, "tpot": 50}],
        json_schema_extra=_cli(cli_format="kv", cli_default="none"),
    )
    health_check_interval_s: NonNegativeFloat = Field(
        2.0,
        description="Seconds between <base_url>/health polls (0: none); the sweep stops at once when the "
        "target cannot be reached, or answers 5xx or times out three times in a row.",
    )
    sessions: SessionSettings | None = Field(
        None,
        description="Multi-turn sessions, for dataset sessions only (its defaults when not given); on the "
        'command line a JSON object, e.g. {"turns": 3, "think_time_s": 1}.',
        json_schema_extra=_cli(cli_format="json", cli_default="none; the defaults with dataset sessions"),
    )
    trace: TraceSettings | None = Field(
        None,
        description="Trace replay, for dataset mooncake_trace only (its defaults when not given); on the "
        'command line a JSON object, e.g. {"speed": 2}.',
        json_schema_extra=_cli(cli_format="json", cli_default="none; the defaults with dataset mooncake_trace"),
    )
    client: ClientName = Field(
        "pdbench",
        description="The client whose numbers are the sweep's: pdbench, aiperf or vllm (`vllm bench serve`); "
        "an external one runs inside `pdbench bench` against the same proxy, its artifacts under clients/.",
    )
    cross_check: list[ExternalClient] = Field(
        default_factory=list,
        description="Clients that measure the same servers after the sweep's client, at the same "
        "concurrencies (aiperf, vllm); the report puts their numbers beside pdbench's.",
        json_schema_extra=_cli(cli_format="csv"),
    )
    aiperf: AiperfSettings = Field(
        default_factory=AiperfSettings,
        description="aiperf's command, trace source and bounds (client or cross_check aiperf).",
    )
    vllm_bench: VllmBenchSettings = Field(
        default_factory=VllmBenchSettings,
        description="`vllm bench serve`'s command and bounds (client or cross_check vllm).",
    )
    validity: ValidityThresholds = Field(
        default_factory=ValidityThresholds,
        description="Thresholds of the rules that judge each point from the servers' /metrics.",
    )
    sentinels: SentinelSettings = Field(
        default_factory=SentinelSettings,
        description="Greedy sentinel prompts in every point, their answers compared token by token with a "
        "reference answered whole by one instance (validity rule outputs_match).",
    )
    # Left out of the lock (and the fingerprint) when not set: recipes without it keep theirs.
    profile: ProfileSettings | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="Profiles of the measured window on chosen roles and points (docs/profiling.md); on the "
        'command line a JSON object, e.g. {"points": [8], "roles": ["decode"]}.',
        json_schema_extra=_cli(cli_format="json", cli_default="none; no profiles"),
    )
    # Left out of the lock (and the fingerprint) when not set: recipes without it keep theirs.
    slo_search: SloSearchSettings | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="Make the sweep an SLO search over the ladder `concurrency` (ascending): only the points "
        "the search needs run, each SLO's best is measured again, and slo_search.json records every step "
        "(docs/search.md). On the command line a JSON object.",
        json_schema_extra=_cli(cli_format="json", cli_default="none; every concurrency is run"),
    )

    # Left out of the lock (and the fingerprint) while empty: recipes without workloads keep theirs.
    workloads: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description="More sweeps over the same servers after the job's own, in order (docs/workloads.md): "
        "name -> the benchmark keys that differ (e.g. {isl: 8192}), deep-merged into this section and "
        "validated as a whole; each writes into workloads/<name>/ and its results carry metadata.workload. "
        "Names: lower-case letters, digits and '-', 1-32 characters.",
    )

    @model_validator(mode="before")
    @classmethod
    def _csv_lists(cls, data: Any) -> Any:
        # `--set benchmark.concurrency=1,2,8` as `pdbench bench --concurrency 1,2,8`: a list field
        # written comma-separated on the command line may be given so in a recipe or --set too.
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, info in cls.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get("cli_format") == "csv" and isinstance(out.get(name), str):
                out[name] = [item.strip() for item in out[name].split(",") if item.strip()]
        return out

    @field_validator("concurrency")
    @classmethod
    def _check_concurrency(cls, v: list[int]) -> list[int]:
        # Each point has its own result file name, so duplicates would collide.
        if len(set(v)) != len(v):
            raise ValueError("concurrency values must be unique")
        too_many = [c for c in v if c > MAX_CONCURRENCY]
        if too_many:
            raise ValueError(f"at most {MAX_CONCURRENCY} requests in flight per point (got {too_many[0]})")
        return v

    @field_validator("percentiles")
    @classmethod
    def _check_percentiles(cls, v: list[float]) -> list[float]:
        if any(not 0 <= p <= 100 for p in v):
            raise ValueError("percentiles must be within [0, 100]")
        return v

    @model_validator(mode="after")
    def _check_dataset(self) -> BenchmarkSettings:
        files = ("jsonl", "sharegpt", "mooncake_trace")
        if self.dataset in files and not self.dataset_path:
            raise ValueError(f"dataset {self.dataset!r} needs dataset_path (the file to read)")
        if self.dataset not in files and self.dataset_path:
            raise ValueError(f"dataset_path is only for dataset {', '.join(map(repr, files))}, not {self.dataset!r}")
        return self

    @model_validator(mode="after")
    def _check_sessions(self) -> BenchmarkSettings:
        if self.dataset != "sessions":
            if self.sessions is not None:
                raise ValueError(f"sessions: only for dataset 'sessions' (the dataset is {self.dataset!r})")
            return self
        if self.sessions is None:
            self.sessions = SessionSettings()
        # A session is paced by its own turns and think times, and a point's size is its sessions.
        if not math.isinf(self.request_rate) or self.burstiness != 1.0:
            raise ValueError(
                "request_rate, burstiness: do not apply to dataset 'sessions' (a session starts when one of "
                "the concurrency's slots is free; pace its turns with sessions.think_time_s)"
            )
        if self.num_prompts is not None:
            raise ValueError(
                "num_prompts: with dataset 'sessions' a point's size is sessions.num_sessions (set num_prompts to null)"
            )
        if self.num_warmups is not None:
            raise ValueError(
                "num_warmups: with dataset 'sessions' the warmups are sessions.num_warmup_sessions "
                "(set num_warmups to null)"
            )
        if self.workers is not None and self.workers > 1:
            raise ValueError(
                "workers: dataset 'sessions' runs in one load process (each turn's prompt is built from the "
                "answer before it as it arrives)"
            )
        return self

    @model_validator(mode="after")
    def _check_trace(self) -> BenchmarkSettings:
        if self.dataset != "mooncake_trace":
            if self.trace is not None:
                raise ValueError(f"trace: only for dataset 'mooncake_trace' (the dataset is {self.dataset!r})")
            return self
        if self.trace is None:
            self.trace = TraceSettings()
        # The trace's timestamps are the arrivals; each point's concurrency caps the requests in flight.
        if not math.isinf(self.request_rate) or self.burstiness != 1.0:
            raise ValueError(
                "request_rate, burstiness: do not apply to dataset 'mooncake_trace' (requests leave at the "
                "trace's timestamps; scale them with trace.speed)"
            )
        if self.num_prompts is not None:
            raise ValueError(
                "num_prompts: with dataset 'mooncake_trace' a point replays the trace (trace.max_requests)"
            )
        if self.random_prefix_len:
            raise ValueError("random_prefix_len: with dataset 'mooncake_trace' the trace's hash ids make the prefixes")
        return self

    @model_validator(mode="after")
    def _check_clients(self) -> BenchmarkSettings:
        check_clients(self.client, self.cross_check, self.dataset, bool(self.shapes), self.aiperf.trace_source)
        return self

    @model_validator(mode="after")
    def _check_shapes(self) -> BenchmarkSettings:
        if self.shapes:
            if self.isl is not None or self.osl is not None:
                raise ValueError("give isl and osl, or shapes, not both (set isl and osl to null to use shapes)")
            tags = [s.tag for s in self.shapes]
            if dup := sorted({t for t in tags if tags.count(t) > 1}):
                # Each shape names its own result files, so two with one (isl, osl) would collide.
                raise ValueError(f"shapes: each (isl, osl) may appear once; repeated: {', '.join(dup)}")
        elif self.isl is None or self.osl is None:
            what = {
                "sessions": " (sessions: isl is the first turn's prompt, osl every turn's answer)",
                "mooncake_trace": " (mooncake_trace: they name the result; the trace's own lengths are sent)",
            }.get(self.dataset, "")
            raise ValueError(f"give isl and osl (one shape), or shapes (several){what}")
        return self

    @model_validator(mode="after")
    def _check_range_ratio(self) -> BenchmarkSettings:
        ratios = [("range_ratio", self.range_ratio)] + [
            (f"shapes.{i}.range_ratio", s.range_ratio) for i, s in enumerate(self.shapes) if s.range_ratio is not None
        ]
        for key, r in ratios:
            if self.range_ratio_convention == "inferencex" and not 0.0 <= r <= 1.0:
                raise ValueError(f"{key} must be in [0, 1] for the inferencex convention")
            if self.range_ratio_convention == "vllm" and not 0.0 <= r < 1.0:
                # Same bound as vLLM's RandomDataset.
                raise ValueError(f"{key} must be in [0, 1) for the vllm convention")
        return self

    @model_validator(mode="after")
    def _check_slo_search(self) -> BenchmarkSettings:
        search = self.slo_search
        if search is None:
            return self
        ladder = self.concurrency
        if ladder != sorted(ladder):
            raise ValueError(
                f"concurrency: with slo_search it is the ladder and must be ascending (got {', '.join(map(str, ladder))})"
            )
        if search.start is not None and search.start not in ladder:
            raise ValueError(
                f"slo_search.start: {search.start} is not a ladder value (concurrency: {', '.join(map(str, ladder))})"
            )
        if self.shapes:
            raise ValueError("slo_search: one shape per search (isl and osl); shapes would need a ladder each")
        if self.client != "pdbench" or self.cross_check:
            raise ValueError(
                "slo_search: the search judges pdbench's own points; client must be pdbench and cross_check empty"
            )
        # A percentile the results do not carry would fail every point.
        carried = {f"p{p:g}" for p in self.percentiles} | {"p50", "mean"}
        for name, bounds in search.slos.items():
            for key in bounds:
                stat = key.split("_", 1)[1]
                if stat not in carried:
                    raise ValueError(
                        f"slo_search.slos.{name}.{key}: the results carry no {result_key(key)} "
                        f"(add {stat[1:]} to benchmark.percentiles)"
                    )
        return self

    @model_validator(mode="after")
    def _check_workloads(self) -> BenchmarkSettings:
        if self.workloads and self.slo_search is not None:
            raise ValueError(
                "workloads: an SLO search measures one workload per job; drop benchmark.slo_search or "
                "benchmark.workloads"
            )
        for name in self.workloads:
            self.workload(name)  # each merged section valid, or the error naming its key
        return self

    def workload(self, name: str) -> BenchmarkSettings:
        """Workload `name`'s whole benchmark section: this one with its mapping deep-merged in."""
        wl.check_name(name)
        over = self.workloads[name]
        for key in wl.REFUSED:
            if key in over:
                raise ValueError(f"workloads.{name}.{key}: a workload cannot set {key} (it is one sweep of the job)")
        base = self.model_dump(exclude_unset=True, exclude={"workloads"})
        try:
            return BenchmarkSettings.model_validate(wl.merged(base, over))
        except ValidationError as e:
            raise ValueError(wl.nested_error(name, e)) from None

    @model_validator(mode="after")
    def _check_profile(self) -> BenchmarkSettings:
        if self.profile is None:
            return self
        if missing := [p for p in self.profile.points if p not in self.concurrency]:
            raise ValueError(
                f"profile.points: {', '.join(map(str, missing))} not among the sweep's concurrency values "
                f"({', '.join(map(str, self.concurrency))}); a profiled point is one the sweep measures"
            )
        return self

    @property
    def search_start(self) -> int:
        """The SLO search's first ladder value."""
        assert self.slo_search is not None
        return self.slo_search.start if self.slo_search.start is not None else self.concurrency[0]

    @property
    def multi_shape(self) -> bool:
        """Whether the sweep was given as shapes (result names then carry the shape)."""
        return bool(self.shapes)

    def shape_list(self) -> list[Shape]:
        """The sweep's shapes in order, each with its range_ratio filled in."""
        if not self.shapes:
            assert self.isl is not None and self.osl is not None  # _check_shapes
            return [Shape(isl=self.isl, osl=self.osl, range_ratio=self.range_ratio)]
        return [
            s if s.range_ratio is not None else s.model_copy(update={"range_ratio": self.range_ratio})
            for s in self.shapes
        ]

    def num_prompts_for(self, concurrency: int) -> int:
        """Measured requests per point (sessions: every turn of every measured session)."""
        if self.sessions is not None:
            return self.sessions.sessions_for(concurrency) * self.sessions.turns
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.min_prompts, self.prompts_multiplier * concurrency)

    def num_warmups_for(self, concurrency: int) -> int:
        """Unmeasured requests per point (sessions: every turn of every warmup session)."""
        if self.sessions is not None:
            return self.sessions.warmup_sessions_for(concurrency) * self.sessions.turns
        return 2 * concurrency if self.num_warmups is None else self.num_warmups

    def point_timeout_for(self, num_requests: int, concurrency: int) -> float:
        """Upper bound for one batch of requests (warmups or the measured run)."""
        if self.point_timeout_s is not None:
            return self.point_timeout_s
        waves = math.ceil(num_requests / max(1, concurrency))
        if self.sessions is not None:
            # A wave is one session per slot: its turns one after another, think times between.
            s = self.sessions
            sessions = math.ceil(num_requests / s.turns)
            rounds = math.ceil(sessions / max(1, concurrency))
            return (rounds * s.turns + 1) * self.request_timeout_s + rounds * (s.turns - 1) * s.think_time_max_s
        arrivals = 0.0 if math.isinf(self.request_rate) else num_requests / self.request_rate
        return (waves + 1) * self.request_timeout_s + 2 * arrivals
