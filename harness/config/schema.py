"""Pydantic schema of models.yaml and recipes/*.yaml.

Validated once at load time; nothing downstream re-validates. Every model forbids
unknown keys so that a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    model_validator,
)

from harness import kv_connectors
from harness.config.accuracy import AccuracySpec
from harness.config.benchmark import BenchmarkSettings
from harness.config.cpus import parse_groups
from harness.config.image_ref import image_reference
from harness.strict import Strict

# Strings reach job.slurm and server.sh. The renderer quotes every one for the context it
# lands in; these types reject what no quoting can carry: control characters (a newline
# ends a `#SBATCH` line or a comment and starts a command; bash cannot hold NUL), and
# whatever a context gives meaning to besides the shell (names below).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _checker(pattern: str, why: str, allow: str = "") -> AfterValidator:
    bad = re.compile(pattern)

    def check(v: str) -> str:
        m = bad.search(v.translate({ord(c): None for c in allow}))
        if m:
            raise ValueError(f"{m.group()!r} is not allowed here: {why} (got {v!r})")
        return v

    return AfterValidator(check)


def _matching(pattern: str, what: str) -> AfterValidator:
    ok = re.compile(pattern)

    def check(v: str) -> str:
        if not ok.fullmatch(v):
            raise ValueError(f"{v!r} is not {what}")
        return v

    return AfterValidator(check)


_NO_CONTROL = "control characters cannot be written into a shell script"
Text = Annotated[str, _checker(_CONTROL.pattern, _NO_CONTROL)]
# Free text that is rendered as comment lines only: one comment line per line.
Comment = Annotated[str, _checker(_CONTROL.pattern, _NO_CONTROL, allow="\n\t")]
# A bash script, rendered as one single-quoted word (so lines and tabs are kept as they are).
Script = Annotated[str, _checker(_CONTROL.pattern, _NO_CONTROL, allow="\n\t")]
# An `#SBATCH` value, shell-quoted like submitit's `_as_sbatch_flag`; sbatch reads a
# backslash as an escape even inside quotes, so no quoting carries one intact.
SbatchValue = Annotated[str, _checker(r"[\x00-\x1f\x7f\\]", "#SBATCH lines cannot carry control characters or '\\'")]
SbatchOption = Annotated[
    SbatchValue, _matching(r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", "an sbatch option '--name' or '--name=value'")
]
EnvName = Annotated[str, _matching(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")]
# A `vllm serve` flag name without its leading '--' (dots for vLLM's nested config flags).
FlagName = Annotated[str, _matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "a flag name (letters, digits, '-', '_', '.')")]
# A directory name: results/<name>/ and the Slurm job name.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SafeName = Annotated[
    str,
    _matching(
        SAFE_NAME.pattern,
        "a safe name (letters, digits, '.', '_', '-'; not starting with '.' or '-'; at most 100 characters)",
    ),
]
# Container mounts are joined as 'src:dst' into ','-separated lists (enroot, apptainer)
# or `-v src:dst[:options]` (docker), so ',' would add mounts and ':' in a source shifts fields.
MountSource = Annotated[Text, _checker(r"[,:]", "mount lists use ',' between and ':' inside entries")]
MountTarget = Annotated[Text, _checker(r",", "mount lists use ',' between entries")]
# A path on the nodes, mounted into containers as 'src:dst:ro'.
AbsPath = Annotated[MountSource, _matching(r"/.*", "an absolute path")]


# VLLM_CPU_OMP_THREADS_BIND: checked here by the parser the node pins servers with.
def _cpu_bind(v: str) -> str:
    parse_groups(v)
    return v


CpuBind = Annotated[Text, AfterValidator(_cpu_bind)]
IfName = Annotated[str, _matching(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}", "a network interface name")]
# `docker run ... "$IMAGE"`: a leading '-' would be read as an option.
Image = Annotated[Text, _checker(r"^-", "an image name cannot start with '-'"), AfterValidator(image_reference)]


def _time_text(v: Any) -> Any:
    # YAML reads 90 as a number and 1:30:00 as 5400 (base 60): a number cannot say which was meant.
    if isinstance(v, int | float) and not isinstance(v, bool):
        raise ValueError(f"got the number {v}: write the time as a quoted string, e.g. '02:00:00' or '90'")
    return v


# sbatch --time's forms (sbatch(1)); anything else is refused by sbatch once the job is submitted.
SlurmTime = Annotated[
    SbatchValue,
    BeforeValidator(_time_text),
    _matching(
        r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|(?i:infinite|unlimited)",
        "a Slurm time: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES, "
        "DAYS-HOURS:MINUTES:SECONDS or UNLIMITED (e.g. 02:00:00, 90, 1-00:00:00)",
    ),
]

# A vLLM flag value: True renders a bare flag, False/None omits it, dicts and lists render as
# JSON; strings are single-quoted words, so only their control characters are refused.
FlagValue = bool | int | float | str | None | dict[str, Any] | list[Any]
# Linux's MAX_ARG_STRLEN (32 pages of 4 KiB): the most one NAME=value string, with its NUL, may
# take; exec of the server fails with E2BIG (argument list too long) past it.
MAX_ARG_STRLEN = 131072


# Names of credentials: their values belong in `secrets:` (taken from the submitting environment at
# run time), never in `env:`, whose values are written in clear into server.sh and recipe.lock.yaml.
SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|SECRET_KEY)$")


def _env_fits(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if SECRET_NAME.search(name):
            raise ValueError(
                f"{name}: looks like a secret, and env values are written into the job's files; list it "
                f"under secrets: instead (`secrets: [{name}]` passes your environment's {name} at run time)"
            )
        size = len(name.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_ARG_STRLEN:
            raise ValueError(
                f"{name}: its value is {len(value.encode())} bytes; the kernel takes at most {MAX_ARG_STRLEN} "
                "per NAME=value (MAX_ARG_STRLEN), so the server could not start: pass a path to a file instead"
            )
    return env


Env = Annotated[dict[EnvName, Text], AfterValidator(_env_fits)]


def _no_control_in_flags(flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
    for key, value in flags.items():
        if isinstance(value, str) and _CONTROL.search(value):
            raise ValueError(f"flag '{key}': {_NO_CONTROL} (got {value!r})")
    return flags


Flags = Annotated[dict[FlagName, FlagValue], AfterValidator(_no_control_in_flags)]


class ModelSpec(Strict):
    path: Text | None = Field(None, description="local model directory (relative to models.yaml)")
    hf_id: Text | None = Field(None, description="Hugging Face id, resolved by vLLM inside the job")
    precision: Text = Field(description="weights' precision, recorded in results (e.g. fp8, bf16)", examples=["fp8"])
    short_name: (
        Annotated[str, _matching(r"[a-z0-9]+(-[a-z0-9]+)*", "lower-case letters and digits joined by '-'")] | None
    ) = Field(
        None,
        description="the model's token in recipe names, <short_name>-<precision>-... (docs/recipes.md); "
        "a recipe in recipes/ needs it",
        examples=["dsr1"],
    )
    tokenizer: Text | None = Field(None, description="tokenizer path or HF id; default: the model's own")
    served_model_name: Text | None = Field(None, description="name the servers answer to; default: the catalogue key")
    max_model_len: int = Field(gt=0, description="vLLM --max-model-len", examples=[16384])
    prefill_flags: Flags = Field(
        {},
        description="`vllm serve` flags of prefill servers (name without '--': value; true for a bare flag)",
        examples=[{"enforce-eager": True, "block-size": 64}],
    )
    decode_flags: Flags = Field({}, description="`vllm serve` flags of decode servers, as prefill_flags")
    aggregated_flags: Flags | None = Field(
        None, description="`vllm serve` flags of aggregated (baseline) servers; default: decode_flags"
    )
    env: Env = Field({}, description="environment of every server of this model")
    prefill_env: Env = Field({}, description="environment of prefill servers (wins over env)")
    decode_env: Env = Field({}, description="environment of decode servers (wins over env)")
    aggregated_env: Env | None = Field(
        None, description="environment of aggregated (baseline) servers (wins over env); default: decode_env"
    )
    build: Literal["tiny-llama"] | None = Field(
        None, description="builder that makes `path` offline when it is missing"
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.hf_id is None):
            raise ValueError("set exactly one of 'path' or 'hf_id'")
        return self

    @property
    def source(self) -> str:
        return self.path if self.path is not None else self.hf_id  # type: ignore[return-value]


class Catalogue(Strict):
    models: dict[str, ModelSpec] = Field(description="model name (a recipe's `model`) -> its entry")


class RoleSpec(Strict):
    nodes: int = Field(1, ge=1, description="nodes given to this role")
    workers: int = Field(1, ge=1, description="independent vLLM instances of this role")
    tp: int = Field(1, ge=1, description="tensor-parallel size per worker")
    dp: int = Field(1, ge=1, description="data-parallel size per worker")
    ep: int = Field(1, ge=1, description="expert-parallel size; >1 enables expert parallelism")
    dp_attention: bool = Field(False, description="data-parallel attention (needs dp > 1)")
    port: int = Field(ge=1024, le=65535, description="HTTP port of the first worker on a node")
    flags: Flags = Field({}, description="`vllm serve` flags of this role, over the model's")
    env: Env = Field({}, description="environment of this role's servers, over the recipe's and the model's")
    cpu_bind: list[CpuBind] = Field([], description="CPU-only: VLLM_CPU_OMP_THREADS_BIND per worker (cycled)")
    kv_transfer: bool = Field(
        True, description="start with the KV connector; false re-prefills (to check validity rules)"
    )

    @model_validator(mode="after")
    def _check(self) -> RoleSpec:
        if self.dp_attention and self.dp < 2:
            raise ValueError("dp_attention needs dp > 1")
        if self.ep > 1 and self.ep != self.tp * self.dp:
            raise ValueError(f"ep must be 1 or tp*dp = {self.tp * self.dp} (vLLM sets EP = TP x DP)")
        return self

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.dp


class TopologySpec(Strict):
    gpus_per_node: int = Field(8, ge=0, description="0 for CPU-only nodes")
    nic_detection: bool = Field(True, description="servers source `pdbench nic` (RDMA env) before starting")
    prefill: RoleSpec = Field(description="the prefill servers (xP)")
    decode: RoleSpec = Field(description="the decode servers (yD)")
    aggregated_only: bool = Field(
        False,
        description=(
            "run only the aggregated servers of topology.aggregated (aggregated serving, with as many GPUs as "
            "it names; prefill and decode then only state the deployment it is measured against)"
        ),
    )
    aggregated: RoleSpec | None = Field(
        None,
        description=(
            "the aggregated baseline: identical vLLM servers without a KV connector behind the same proxy, "
            "on the job's first `nodes` nodes, using as many GPUs as prefill and decode together; the job "
            "runs its sweep (same prompts) after the disaggregated one, and its results carry disagg false "
            "(kv_transfer does not apply)"
        ),
    )
    colocate: bool = Field(
        False,
        description=(
            "every role on one node (the job's only node): pdbench partitions the node's gpus_per_node GPUs "
            "between the workers of each phase (prefill first, then decode; the aggregated baseline's replicas "
            "on the same GPUs after them) and sets each server's visible devices, its own first and the node's "
            "other GPUs after them for the KV copy between them; every role needs nodes: 1"
        ),
    )

    @model_validator(mode="after")
    def _aggregated_only(self) -> TopologySpec:
        if self.aggregated_only and self.aggregated is None:
            raise ValueError("aggregated_only needs topology.aggregated (the servers to run)")
        if self.colocate:
            roles = [("prefill", self.prefill), ("decode", self.decode), ("aggregated", self.aggregated)]
            spread = [f"{name}.nodes is {spec.nodes}" for name, spec in roles if spec is not None and spec.nodes != 1]
            if spread:
                raise ValueError(f"colocate puts every role on one node: {', '.join(spread)}; set it to 1")
        return self


# kv_transfer_config keys a recipe may set itself; pdbench sets kv_connector, kv_role,
# kv_buffer_device, the extra config and the module path, and engine_id must stay unique.
TransferConfigKey = Literal["kv_load_failure_policy", "kv_port", "enable_permute_local_kv"]


if TYPE_CHECKING:
    ConnectorName = str
else:  # the table's KV connectors, as a Literal so that the recipe reference lists them
    ConnectorName = Literal[kv_connectors.kv_names()]


class ConnectorSpec(Strict):
    name: ConnectorName = Field(description=f"KV connector: {kv_connectors.described(kv_connectors.kv_names(), 'or ')}")
    kv_buffer_device: Literal["cpu", "cuda"] | None = Field(
        None, description="kv_transfer_config.kv_buffer_device; cpu for vLLM on CPU; default: vLLM's"
    )
    side_channel_port: int = Field(
        5600,
        ge=1024,
        le=65535,
        description=(
            "base of the per-worker KV port ranges (one port per rank, disjoint across workers): NIXL's side "
            "channel, MoRI-IO's handshake port, the bundled connector's KV port, Mooncake's bootstrap port"
        ),
    )
    notify_port: int = Field(
        61005,
        ge=1024,
        le=65535,
        description="MoRI-IO: base of the per-worker notify port ranges (vLLM's default for one worker)",
    )
    read_mode: bool = Field(False, description="MoRI-IO READ mode (decode pulls KV)")
    proxy_ping_port: int = Field(36367, ge=1024, le=65535, description="MoRI-IO registration port")
    progress_thread: bool = Field(
        True,
        description=(
            "NIXL: its UCX progress thread (vLLM's default), which polls without pause and keeps a core busy per "
            "engine; false: vLLM's NIXL connector built without it (connector/nixl_polled.py), transfers progressing "
            "when vLLM polls (a read from a busy prefill waits for its next step), for CPU nodes where that core "
            "is the engine's"
        ),
    )
    extra_config: dict[str, Any] = Field({}, description="kv_transfer_config.kv_connector_extra_config")
    transfer_config: dict[TransferConfigKey, Any] = Field(
        {},
        description=(
            "other top-level kv_transfer_config keys (kv_load_failure_policy, kv_port, enable_permute_local_kv); "
            "their values are checked by vLLM's parser at render time"
        ),
        examples=[{"kv_load_failure_policy": "recompute"}],
    )

    @model_validator(mode="after")
    def _extra_keys(self) -> ConnectorSpec:
        # A connector that rejects unknown keys at start-up: say so before the job queues.
        accepted = kv_connectors.get(self.name).extra_keys
        unknown = sorted(set(self.extra_config) - set(accepted)) if accepted is not None else []
        if unknown:
            raise ValueError(
                f"extra_config: unknown key(s) for the {self.name} connector: {', '.join(unknown)}; "
                f"accepted: {', '.join(accepted or ())}"
            )
        if not self.progress_thread and kv_connectors.get(self.name).without_progress_thread is None:
            with_it = [c for c in kv_connectors.kv_names() if kv_connectors.get(c).without_progress_thread]
            raise ValueError(
                f"progress_thread: false applies to {', '.join(with_it)} only, not the {self.name} connector"
            )
        return self


ProxyKind = Literal["pdbench", "vllm-router"]
ROUTER_METRICS_PORT = 29000  # vllm-router's own default


class ProxySpec(Strict):
    kind: ProxyKind = Field(
        "pdbench",
        description=(
            "the PD router on node 0: pdbench's own proxy, or vllm-router (PyPI vllm-router, in the job's "
            "Python) with its own arguments for the connector (NIXL, Mooncake, MoRI-IO by discovery); "
            "vllm-router writes no per-request timings, so a result has no TTFT breakdown"
        ),
    )
    # Left out of the lock (and the fingerprint) while unset: pdbench-proxy recipes keep theirs.
    metrics_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        exclude_if=lambda v: v is None,
        description=f"kind vllm-router: its Prometheus port on node 0 (loopback), which it always binds; "
        f"default: {ROUTER_METRICS_PORT}",
    )

    @property
    def router_metrics_port(self) -> int:
        return self.metrics_port or ROUTER_METRICS_PORT

    port: int = Field(30000, ge=1024, le=65535, description="the proxy's HTTP port on node 0 (loopback)")
    policy: Literal["round_robin", "least_outstanding", "prefix_hash", "session"] = Field(
        "round_robin",
        description="how the proxy picks a prefill and a decode worker per request; session: every "
        "request with the same X-Session-Id header (else the same prompt prefix) goes to the same "
        "instances, so their prefix caches hold the session's earlier turns",
    )
    request_timeout_s: float = Field(600, gt=0, description="seconds allowed for one upstream request")
    stream_idle_timeout_s: float = Field(300, gt=0, description="seconds a stream may go without a byte")
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "proxy processes sharing its port (SO_REUSEPORT); legs in flight per instance and open "
            "circuits are shared across them, so least-outstanding and the circuit breaker see every "
            "process's load; each polls health itself; MoRI-IO keeps its registrations in one process "
            "and needs 1"
        ),
    )
    # Left out of the lock (and the fingerprint) while unset: recipes without arms keep theirs.
    arms: list[ProxyKind] = Field(
        [],
        exclude_if=lambda v: not v,
        description=(
            "router arms in one job: the routers that measure the same servers, prompts and seeds one after "
            "the other, kind first (e.g. [pdbench, vllm-router]); each is started, health-gated, measured over "
            "the whole sweep and stopped before the next; kind's points are the run's results, each other "
            "arm's go to arms/<arm>/; every point carries metadata.arm; no direct arm: a PD request needs a "
            "router to carry its kv_transfer_params"
        ),
    )
    overlap: bool = Field(
        False,
        description=(
            "connector pdbench: send each request's decode leg together with its prefill leg, so decode's "
            "front end runs while prefill computes and its pull waits at prefill for the KV (the connector's "
            "early_wait_s); the first request per prefill instance, and prefill with DP > 1, stay two-phase"
        ),
    )


class SetupStep(Strict):
    name: SafeName = Field(description="names the step in logs and failures")
    run: Script = Field(
        description="a bash script (set -euo pipefail), run as root in the image, e.g. pip install mooncake-transfer-engine"
    )
    timeout_s: int = Field(1800, gt=0, description="the step fails after this many seconds")


class ContainerSpec(Strict):
    runtime: Literal["docker", "podman", "enroot", "apptainer", "none"] = Field(
        "docker", description="one container per node with this runtime; none runs on the host"
    )
    image: Image | None = Field(
        None, description="container image (required unless runtime is none)", examples=["vllm/vllm-openai:v0.11.0"]
    )
    # A relative source is no host path to the runtimes (docker reads it as a volume name).
    mounts: dict[AbsPath, MountTarget] = Field({}, description="absolute host path -> container path[:options]")
    gpus: Literal["auto", "nvidia", "amd", "none"] = Field(
        "auto",
        description=(
            "docker/podman: how the container gets the node's GPUs: nvidia (--gpus all, or CDI with podman), "
            "amd (/dev/kfd and /dev/dri), none; auto picks by the devices each node has"
        ),
    )
    privileged: bool = Field(
        True,
        description=(
            "docker/podman: --privileged, as the vendors' own jobs run (RDMA, NUMA, every GPU device); "
            "off where the host refuses it (a container host without all capabilities)"
        ),
    )
    pull_timeout_s: int = Field(
        1800, gt=0, description="docker/podman: a node that lacks the image pulls it within this many seconds"
    )
    setup: list[SetupStep] = Field(
        [],
        description=(
            "docker/podman: steps that prepare the image (packages, builds), run once per image and node: the "
            "result is kept as an image keyed by the base image's id and the steps' text, so a later job on "
            "the node starts from it at no cost"
        ),
    )

    @model_validator(mode="after")
    def _image(self) -> ContainerSpec:
        if self.runtime != "none" and not self.image:
            raise ValueError(f"container runtime '{self.runtime}' needs an image")
        if self.setup and self.runtime not in ("docker", "podman"):
            raise ValueError(f"set-up steps need runtime docker or podman (not '{self.runtime}')")
        if len({s.name for s in self.setup}) != len(self.setup):
            raise ValueError("set-up step names must be unique")
        return self


class SiteSpec(Strict):
    """Where a cluster keeps things; usually set by a cluster profile (clusters/<name>.yaml)."""

    model_root: AbsPath | None = Field(
        None,
        description=(
            "shared directory of model weights: a model with an hf_id is served from <model_root>/<hf_id>, "
            "mounted read-only, offline"
        ),
        examples=["/shared/models"],
    )
    hf_cache: AbsPath | None = Field(
        None,
        description=(
            "shared Hugging Face hub cache (HF_HUB_CACHE), mounted read-only: models with an hf_id load from it "
            "offline when there is no model_root"
        ),
    )
    pdbench_root: AbsPath | None = Field(
        None,
        description="pdbench's checkout at the same path on every node (shared storage); default: this checkout",
    )
    python: AbsPath | None = Field(
        None,
        description="runtime none: pdbench's Python on the nodes; default: <pdbench_root>/.venv/bin/python",
    )
    node_interface: IfName | None = Field(
        None,
        description=(
            "network interface whose IPv4 address is each node's address (proxy, health checks, KV side "
            "channels); default: the address the host name resolves to"
        ),
        examples=["ens1f0np0"],
    )
    # What the cluster costs, for each point's dollars (harness.power.energy): left out of the lock
    # while unset, and of the fingerprint always (harness.config.load).
    gpu_hour_usd: float | None = Field(
        None,
        gt=0,
        exclude_if=lambda v: v is None,
        description="price of one GPU for one hour in US dollars: each point's cost and $ per million tokens",
        examples=[2.5],
    )
    kwh_usd: float | None = Field(
        None,
        gt=0,
        exclude_if=lambda v: v is None,
        description="price of one kWh of GPU energy in US dollars, added to the GPU-hours where given",
        examples=[0.12],
    )


class SlurmSpec(Strict):
    job_name: SbatchValue | None = Field(None, description="sbatch --job-name; default: pdbench-<recipe>")
    partition: SbatchValue | None = Field(None, description="sbatch --partition")
    account: SbatchValue | None = Field(None, description="sbatch --account")
    qos: SbatchValue | None = Field(None, description="sbatch --qos")
    time_limit: SlurmTime = Field("02:00:00", description="sbatch --time")
    time_limit_warning_s: int = Field(
        120,
        ge=0,
        le=65535,
        description=(
            "sbatch --signal=USR2@<s>: this long before the time limit every node stops the sweep, keeps the "
            "finished points and records the job as timeout (Slurm may signal up to 60 s early); 0: none"
        ),
    )
    nodelist: SbatchValue | None = Field(None, description="sbatch --nodelist")
    exclude: SbatchValue | None = Field(None, description="sbatch --exclude")
    reservation: SbatchValue | None = Field(None, description="sbatch --reservation")
    constraint: SbatchValue | None = Field(None, description="sbatch --constraint")
    extra_sbatch: list[SbatchOption] = Field([], description="'--name' or '--name=value' (the value is quoted)")
    gpu_request: Literal["gpus-per-node", "gres", "none"] = Field(
        "gpus-per-node",
        description=(
            "how the job asks for GPUs: --gpus-per-node=N, --gres=<gres_name>:N (clusters without GPU "
            "scheduling reject --gpus-per-node), or not at all (whole nodes, --exclusive)"
        ),
    )
    gres_name: SbatchValue = Field("gpu", description="gpu_request gres: the GRES name (and type), e.g. gpu:h200")


class TimeoutSpec(Strict):
    rendezvous_s: float = Field(600, gt=0, description="all nodes of the job have started")
    health_s: float = Field(1800, gt=0, description="every server and the proxy are ready")
    smoke_s: float = Field(300, gt=0, description="one request through the proxy")
    bench_s: float = Field(4 * 3600, gt=0, description="the whole sweep (of each client: the job's, each workload's)")
    teardown_s: float = Field(30, gt=0, description="SIGTERM to SIGKILL grace")
    settle_s: float = Field(
        10, gt=0, description="a node stopped by another's failure waits this long for that node's own record"
    )
    job_s: float = Field(6 * 3600, gt=0, description="local launcher: whole job")


class Recipe(Strict):
    name: SafeName | None = Field(None, description="names results/<name>/; default: the file's stem")
    description: Comment = Field("", description="free text, written as comments into the scripts")
    model: Text = Field(description="a model of models.yaml", examples=["deepseek-r1-fp8"])
    container: ContainerSpec = Field(ContainerSpec(runtime="none"), description="the per-node container")
    topology: TopologySpec = Field(description="nodes, GPUs and the xP+yD servers")
    connector: ConnectorSpec = Field(description="the KV connector between prefill and decode")
    proxy: ProxySpec = Field(ProxySpec(), description="the PD proxy in front of the servers")
    benchmark: BenchmarkSettings = Field(description="what the sweep measures (the settings of `pdbench bench`)")
    # Left out of the lock (and the fingerprint) while off: recipes without evals keep theirs.
    accuracy: AccuracySpec = Field(
        AccuracySpec(), exclude_if=lambda a: not a.enabled, description="lm-eval accuracy against the job's proxy"
    )
    slurm: SlurmSpec = Field(SlurmSpec(), description="sbatch options")
    site: SiteSpec = Field(SiteSpec(), description="the cluster's storage, install location and network")
    timeouts: TimeoutSpec = Field(TimeoutSpec(), description="bounds on every stage of the job")
    env: Env = Field({}, description="environment for every process of the job")
    secrets: list[EnvName] = Field(
        [],
        description="names of variables (e.g. HF_TOKEN) passed from the submitting environment to every server "
        "at run time, by name: their values never reach a rendered file, the lock or a log",
        examples=[["HF_TOKEN"]],
    )

    @model_validator(mode="after")
    def _secrets_only_by_name(self) -> Recipe:
        if len(set(self.secrets)) != len(self.secrets):
            raise ValueError(f"secrets: each name once (got {self.secrets})")
        for where, env in [("env", self.env)] + [
            (f"topology.{r}.env", spec.env)
            for r in ("prefill", "decode", "aggregated")
            if (spec := getattr(self.topology, r)) is not None
        ]:
            if both := sorted(set(self.secrets) & set(env)):
                raise ValueError(f"secrets: {', '.join(both)} also set in {where}, where its value is written out")
        return self

    @model_validator(mode="after")
    def _proxy_workers(self) -> Recipe:
        use = kv_connectors.get(self.connector.name).proxy
        if self.proxy.workers > 1 and use.single_process:
            raise ValueError(
                f"proxy.workers: {kv_connectors.get(self.connector.name).title} keeps its registrations in one proxy "
                "process; it must be 1"
            )
        if self.proxy.overlap and "overlap" not in use.settings:
            early = " or ".join(kv_connectors.accepting("overlap"))
            raise ValueError(f"proxy.overlap: only the {early} connector can pull early, not {self.connector.name}")
        return self

    @model_validator(mode="after")
    def _router_arms(self) -> Recipe:
        arms, kind = self.proxy.arms, self.proxy.kind
        if not arms:
            return self
        if len(arms) < 2 or len(set(arms)) != len(arms) or arms[0] != kind:
            raise ValueError(
                f"proxy.arms: {arms} must name two or more routers, each once, proxy.kind ({kind}) first "
                "(its points are the run's results)"
            )
        use = kv_connectors.get(self.connector.name)
        if self.topology.aggregated is not None:
            raise ValueError("proxy.arms: the arms measure the disaggregated servers; drop topology.aggregated")
        if use.proxy.single_process or (use.vllm_router is not None and use.vllm_router.discovery):
            raise ValueError(
                f"proxy.arms: the {self.connector.name} connector's workers register with the router they start "
                "with, so a later arm would have none; use one proxy.kind per job"
            )
        if self.benchmark.slo_search is not None:
            raise ValueError("proxy.arms: an SLO search measures one deployment per job; drop benchmark.slo_search")
        return self

    @model_validator(mode="after")
    def _router_serves_connector(self) -> Recipe:
        p = self.proxy
        if "vllm-router" not in (p.kind, *p.arms):
            return self
        key = "proxy.kind" if p.kind == "vllm-router" else "proxy.arms"
        if kv_connectors.get(self.connector.name).vllm_router is None:
            served = ", ".join(n for n in kv_connectors.kv_names() if kv_connectors.get(n).vllm_router is not None)
            raise ValueError(
                f"{key}: vllm-router does not serve the {self.connector.name} connector "
                f"(it serves {served}); "
                + (
                    f"use proxy.kind: pdbench for {self.connector.name}"
                    if key == "proxy.kind"
                    else f"leave vllm-router out of proxy.arms for {self.connector.name}"
                )
            )
        # What only pdbench's proxy does: refused, not silently dropped.
        if p.policy != "round_robin":
            raise ValueError(f"proxy.policy: {p.policy} is pdbench's proxy's; with vllm-router use round_robin")
        if p.workers != 1:
            raise ValueError("proxy.workers: vllm-router is one process (its own threads); it must be 1")
        if p.port == p.router_metrics_port:
            raise ValueError(f"proxy.metrics_port: {p.router_metrics_port} is also proxy.port")
        return self

    @model_validator(mode="after")
    def _workloads_alone(self) -> Recipe:
        # Each later sweep measures the job's disaggregated servers through its one router.
        if not self.benchmark.workloads:
            return self
        if self.proxy.arms:
            raise ValueError(
                "benchmark.workloads: not supported with proxy.arms yet (each arm would need every workload); "
                "drop proxy.arms or benchmark.workloads"
            )
        if self.topology.aggregated is not None:
            raise ValueError(
                "benchmark.workloads: not supported with topology.aggregated yet (the aggregated baseline would "
                "need every workload too); drop topology.aggregated or benchmark.workloads"
            )
        return self

    @model_validator(mode="after")
    def _profiled_roles_served(self) -> Recipe:
        # A profiled role without servers in this topology would profile nothing (bench log only).
        if (prof := self.benchmark.profile) is not None:
            topo = self.topology
            both = ["prefill", "decode", *(["aggregated"] if topo.aggregated is not None else [])]
            prof.check_roles(["aggregated"] if topo.aggregated_only else both)
        return self

    @model_validator(mode="after")
    def _one_search_per_job(self) -> Recipe:
        # Two sweeps in one run directory would share slo_search.json and repeats/.
        topo = self.topology
        if self.benchmark.slo_search is not None and topo.aggregated is not None and not topo.aggregated_only:
            raise ValueError(
                "benchmark.slo_search: this job runs two sweeps (the disaggregated one and the aggregated "
                "baseline's); an SLO search measures one deployment per job (search the aggregated one with "
                "topology.aggregated_only: true)"
            )
        return self
