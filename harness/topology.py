"""The recipe's xP+yD topology as typed data: workers, their nodes, ports and devices.

Templates only print what this module decides (no index arithmetic in bash).
Nodes are numbered as Slurm numbers them: prefill nodes first (node 0 also runs the
proxy and the benchmark client), then decode nodes.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from harness.config.cpus import parse_cpus
from harness.config.load import ConfigError, ResolvedRecipe
from harness.config.schema import RoleSpec, TimeoutSpec
from harness.strict import FrozenStrict

Role = Literal["prefill", "decode", "aggregated"]
ROLES: tuple[Role, Role] = ("prefill", "decode")
# The job's phases, in order: the disaggregated sweep, then (topology.aggregated) the
# aggregated baseline on the same nodes. Each phase has its own servers, proxy and client.
Phase = Literal["disagg", "aggregated"]


@dataclass(frozen=True)
class Worker:
    role: Role
    index: int  # within its role
    nodes: tuple[int, ...]  # the first is the leader (HTTP server); the others run headless
    local_index: int  # among the workers of its role on its leader node
    port: int
    side_channel_port: int  # NIXL: base of this worker's per-rank ports (0: no KV connector)
    devices: int  # accelerators (or CPU "devices") this worker uses: tp x dp
    visible_devices: str | None  # e.g. "0,1,2,3"; None when the worker owns its nodes
    cpu_bind: str | None
    span: Literal["single", "data_parallel", "tensor_parallel"] = "single"

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def phase(self) -> Phase:
        return "aggregated" if self.role == "aggregated" else "disagg"

    @property
    def node(self) -> int:
        return self.nodes[0]

    def process_name(self, rank: int) -> str:
        """rank 0 is the leader; a follower on the worker's rank-th node is '<name>-f<rank>'."""
        return self.name if rank == 0 else f"{self.name}-f{rank}"


@dataclass(frozen=True)
class Process:
    """One long-running process of the job on one node."""

    name: str
    node: int
    kind: Literal["server", "follower", "proxy"]
    worker: str | None = None
    port: int | None = None  # HTTP port for health checks (servers and proxy)
    cpu_bind: str | None = None
    phase: Phase = "disagg"
    arm: str | None = None  # a router arm after the job's own proxy (proxy.arms): started by the node in turn


@dataclass(frozen=True)
class JobPlan:
    num_nodes: int
    workers: tuple[Worker, ...]
    proxy_port: int
    proxy_node: int = 0
    aggregated_only: bool = False  # topology.aggregated_only: no disaggregated phase
    arms: tuple[str, ...] = ()  # proxy.arms after the first (proxy.kind): measured in turn in the disagg phase
    workloads: tuple[str, ...] = ()  # benchmark.workloads: measured in turn after the disagg phase's sweep

    def role(self, role: Role) -> list[Worker]:
        return [w for w in self.workers if w.role == role]

    def devices(self, role: Role) -> int:
        return sum(w.devices for w in self.role(role))

    @property
    def phases(self) -> tuple[Phase, ...]:
        if self.aggregated_only:
            return ("aggregated",)
        return ("disagg", "aggregated") if self.role("aggregated") else ("disagg",)

    def processes(self) -> list[Process]:
        procs = []
        for phase in self.phases:
            for w in (w for w in self.workers if w.phase == phase):
                procs.append(Process(w.name, w.node, "server", w.name, w.port, w.cpu_bind, phase))
                procs += [
                    Process(w.process_name(r), n, "follower", w.name, None, w.cpu_bind, phase)
                    for r, n in enumerate(w.nodes)
                    if r > 0
                ]
            procs.append(Process(proxy_name(phase), self.proxy_node, "proxy", None, self.proxy_port, phase=phase))
            if phase == "disagg":
                procs += [
                    Process(arm_proxy_name(a), self.proxy_node, "proxy", None, self.proxy_port, phase=phase, arm=a)
                    for a in self.arms
                ]
        return procs

    def to_json(self) -> dict:
        return {
            "num_nodes": self.num_nodes,
            "proxy_node": self.proxy_node,
            "proxy_port": self.proxy_port,
            **({"aggregated_only": True} if self.aggregated_only else {}),
            **({"arms": list(self.arms)} if self.arms else {}),
            **({"workloads": list(self.workloads)} if self.workloads else {}),
            "workers": [dict(asdict(w), name=w.name, node=w.node) for w in self.workers],
            # A process's arm only where it has one: plans without arms read as before.
            "processes": [
                {k: v for k, v in asdict(p).items() if k != "arm" or v is not None} for p in self.processes()
            ],
        }


def proxy_name(phase: Phase) -> str:
    return "proxy" if phase == "disagg" else f"proxy-{phase}"


def bench_name(phase: Phase) -> str:
    return "bench" if phase == "disagg" else f"bench-{phase}"


def arm_proxy_name(arm: str) -> str:
    """The router of a later arm (proxy.arms), on the proxy's node and port once the one before it stopped."""
    return f"proxy-arm-{arm}"


def arm_bench_name(arm: str) -> str:
    return f"bench-arm-{arm}"


def workload_bench_name(name: str) -> str:
    """The client of a workload (benchmark.workloads), started after the one before it ended."""
    return f"bench-workload-{name}"


class PreflightSpec(FrozenStrict):
    """What every node checks before starting a server (see harness/node/preflight.py)."""

    weights_path: str | None = None  # as the job sees it
    hf_id: str | None = None
    hf_cache: str | None = None
    need_weights: bool = True  # false with --load-format dummy: config and tokenizer only
    gpus: dict[int, int] = Field(default_factory=dict)  # node -> GPUs its processes use
    ports: dict[int, list[int]] = Field(default_factory=dict)  # node -> TCP ports its processes bind
    memory_bytes: dict[int, int] = Field(default_factory=dict)  # node -> host memory its servers reserve (CPU KV cache)
    rdma: bool = False  # the connector needs active RDMA ports
    nsys_nodes: list[int] = Field(
        default_factory=list
    )  # nodes that run a server under nsys (benchmark.profile.tool: nsys)
    node_interface: str | None = None  # the node address is this interface's IPv4


class PlanFile(FrozenStrict):
    """plan.json: what the renderer decided, read back as this model by every node runtime.

    The workers' derived `name` and `node` are written for readers of the file and
    ignored when it is read back (they follow from role, index and nodes).
    """

    num_nodes: int
    proxy_node: int
    proxy_port: int
    aggregated_only: bool = False
    arms: tuple[str, ...] = ()
    workloads: tuple[str, ...] = ()
    workers: tuple[Worker, ...]
    processes: tuple[Process, ...]
    recipe: str
    fingerprint: str
    served_model_name: str
    timeouts: TimeoutSpec
    preflight: PreflightSpec = PreflightSpec()

    @field_validator("workers", mode="before")
    @classmethod
    def _drop_derived(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [{k: x for k, x in w.items() if k not in ("name", "node")} if isinstance(w, dict) else w for w in v]
        return v

    @classmethod
    def of(cls, rr: ResolvedRecipe, p: JobPlan, preflight: PreflightSpec | None = None) -> PlanFile:
        return cls(
            num_nodes=p.num_nodes,
            proxy_node=p.proxy_node,
            proxy_port=p.proxy_port,
            aggregated_only=p.aggregated_only,
            arms=p.arms,
            workloads=p.workloads,
            workers=p.workers,
            processes=tuple(p.processes()),
            recipe=rr.name,
            fingerprint=rr.fingerprint,
            served_model_name=rr.served_model_name,
            timeouts=rr.recipe.timeouts,
            preflight=preflight or PreflightSpec(),
        )

    def to_json(self) -> dict:
        return self.job_plan().to_json() | self.model_dump(
            mode="json", include={"recipe", "fingerprint", "served_model_name", "timeouts", "preflight"}
        )

    def job_plan(self) -> JobPlan:
        return JobPlan(
            self.num_nodes,
            self.workers,
            self.proxy_port,
            self.proxy_node,
            self.aggregated_only,
            self.arms,
            self.workloads,
        )

    def processes_on(self, node: int | None = None) -> list[Process]:
        return [p for p in self.processes if node is None or p.node == node]


def _role_workers(
    rr: ResolvedRecipe, role: Role, spec: RoleSpec, first_node: int, side_port: int
) -> tuple[list[Worker], int]:
    key = f"topology.{role}"
    gpn = rr.recipe.topology.gpus_per_node
    if spec.nodes > spec.workers:
        return _spanning_workers(rr, role, spec, first_node, side_port)
    if spec.workers % spec.nodes:
        raise ConfigError(rr.blame(key), key, f"workers ({spec.workers}) must be a multiple of nodes ({spec.nodes})")
    per_node = spec.workers // spec.nodes
    if not gpn:
        _check_cpu_ranks(rr, key, spec)
    if gpn and per_node * spec.gpus_per_worker > gpn:
        raise ConfigError(
            rr.blame(key),
            key,
            f"{per_node} worker(s) per node x tp*dp {spec.gpus_per_worker} needs "
            f"{per_node * spec.gpus_per_worker} GPUs, but topology.gpus_per_node is {gpn}{_gpn_source(rr, key)}",
        )
    workers = []
    for i in range(spec.workers):
        local = i % per_node
        visible = None
        if gpn and per_node > 1:
            first = local * spec.gpus_per_worker
            visible = ",".join(str(d) for d in range(first, first + spec.gpus_per_worker))
        workers.append(
            Worker(
                role=role,
                index=i,
                nodes=(first_node + i // per_node,),
                local_index=local,
                port=spec.port + local,
                side_channel_port=side_port,
                devices=spec.gpus_per_worker,
                visible_devices=visible,
                cpu_bind=spec.cpu_bind[i % len(spec.cpu_bind)] if spec.cpu_bind else None,
            )
        )
        # NIXL uses base + dp_rank*tp + tp_rank per rank; keep every worker's range disjoint
        # so that instances sharing a host (the local launcher) never collide.
        side_port += spec.gpus_per_worker
    return workers, side_port


def _gpn_source(rr: ResolvedRecipe, key: str) -> str:
    """' (set by FILE)' when the node's GPU count came from elsewhere than the role's settings
    (a cluster profile, --set): the two that disagree are then both named."""
    src = rr.blame("topology.gpus_per_node")
    return f" (set by {src})" if src != rr.blame(key) else ""


def _check_cpu_ranks(rr: ResolvedRecipe, key: str, spec: RoleSpec) -> None:
    """On CPU-only nodes vLLM binds rank i of a worker to the i-th '|'-separated core group of
    VLLM_CPU_OMP_THREADS_BIND (cpu_bind); a rank without a group fails at start-up."""
    ranks = spec.gpus_per_worker
    for bind in spec.cpu_bind:
        groups = len(bind.split("|"))
        if groups != ranks:
            raise ConfigError(
                rr.blame(f"{key}.cpu_bind"),
                f"{key}.cpu_bind",
                f"{bind!r} gives {groups} core group(s), but each worker has tp*dp = {ranks} rank(s) and "
                f"topology.gpus_per_node is 0{_gpn_source(rr, f'{key}.cpu_bind')} (CPU-only nodes, one core group per rank): give "
                f"{ranks} groups separated by '|' (e.g. '0-3|4-7'), or run this recipe on GPU nodes",
            )


def _spanning_workers(
    rr: ResolvedRecipe, role: Role, spec: RoleSpec, first_node: int, side_port: int
) -> tuple[list[Worker], int]:
    """Workers that need more GPUs than a node has: data parallel across nodes when a TP
    group fits in a node, else tensor parallel across nodes."""
    key = f"topology.{role}"
    gpn = rr.recipe.topology.gpus_per_node
    if spec.nodes % spec.workers:
        raise ConfigError(rr.blame(key), key, f"nodes ({spec.nodes}) must be a multiple of workers ({spec.workers})")
    per_worker = spec.nodes // spec.workers
    if not gpn or spec.gpus_per_worker != per_worker * gpn:
        raise ConfigError(
            rr.blame(key),
            key,
            f"a worker on {per_worker} nodes must use all their GPUs: tp*dp is {spec.gpus_per_worker}, "
            f"nodes x topology.gpus_per_node is {per_worker * gpn}{_gpn_source(rr, key)}",
        )
    span: Literal["data_parallel", "tensor_parallel"]
    if spec.tp <= gpn:
        span = "data_parallel"
        if gpn % spec.tp:
            raise ConfigError(rr.blame(f"{key}.tp"), f"{key}.tp", f"tp ({spec.tp}) must divide gpus_per_node ({gpn})")
    else:
        span = "tensor_parallel"
        if spec.dp != 1 or spec.tp != per_worker * gpn:
            raise ConfigError(
                rr.blame(key),
                key,
                "a TP group larger than a node needs dp = 1 and tp = nodes per worker x gpus_per_node",
            )
    workers = []
    for i in range(spec.workers):
        nodes = tuple(first_node + i * per_worker + k for k in range(per_worker))
        workers.append(
            Worker(
                role=role,
                index=i,
                nodes=nodes,
                local_index=0,
                port=spec.port,
                side_channel_port=side_port,
                devices=spec.gpus_per_worker,
                visible_devices=None,
                cpu_bind=spec.cpu_bind[i % len(spec.cpu_bind)] if spec.cpu_bind else None,
                span=span,
            )
        )
        side_port += spec.gpus_per_worker
    return workers, side_port


def plan(rr: ResolvedRecipe, single_host: bool = False) -> JobPlan:
    """The job's workers on its nodes. `single_host`: every node runs on this one host (the
    local launcher), so a role's workers take consecutive ports job-wide, not per node."""
    topo = rr.recipe.topology
    side = rr.recipe.connector.side_channel_port
    prefill, side = _role_workers(rr, "prefill", topo.prefill, 0, side)
    # colocate: decode on the prefill node (the schema made every role's nodes 1)
    decode, _ = _role_workers(rr, "decode", topo.decode, 0 if topo.colocate else topo.prefill.nodes, side)
    num_nodes = 1 if topo.colocate else topo.prefill.nodes + topo.decode.nodes
    aggregated = _aggregated_workers(rr, num_nodes, prefill + decode)
    workers = prefill + decode + aggregated
    if single_host:
        workers = [_one_host_port(rr, w) for w in workers]
    if topo.colocate and topo.gpus_per_node:
        workers = _place_on_one_node(rr, workers)
    plan_ = JobPlan(
        num_nodes=num_nodes,
        workers=tuple(workers),
        proxy_port=rr.recipe.proxy.port,
        aggregated_only=topo.aggregated_only,
        arms=tuple(rr.recipe.proxy.arms[1:]),
        workloads=tuple(rr.recipe.benchmark.workloads),
    )
    _check_ports(rr, plan_, single_host=single_host)
    return plan_


def _one_host_port(rr: ResolvedRecipe, w: Worker) -> Worker:
    """On one host a role's workers on different nodes would share the role's first port:
    each takes the role's port plus its index in the role instead."""
    spec = rr.recipe.topology.aggregated if w.role == "aggregated" else getattr(rr.recipe.topology, w.role)
    assert spec is not None
    return w if len(w.nodes) > 1 else dataclasses.replace(w, port=spec.port + w.index)


def _place_on_one_node(rr: ResolvedRecipe, workers: list[Worker]) -> list[Worker]:
    """topology.colocate: the node's GPUs in order to the workers of each phase (prefill, then
    decode; the baseline's replicas on the same GPUs once the disaggregated servers are gone).
    vLLM takes the first tp x dp visible devices, so each server sees its own GPUs first and the
    node's others after them: the peer a connector copies the KV to or from stays visible."""
    gpn = rr.recipe.topology.gpus_per_node
    # An aggregated-only job never starts its disaggregated servers: they take no GPUs.
    phases = ("aggregated",) if rr.recipe.topology.aggregated_only else ("disagg", "aggregated")
    placed: list[Worker] = [w for w in workers if w.phase not in phases]
    for phase in phases:
        members = [w for w in workers if w.phase == phase]
        need = sum(w.devices for w in members)
        if need > gpn:
            names = ", ".join(f"{w.name} {w.devices}" for w in members)
            key = "topology.colocate"
            label = "disaggregated" if phase == "disagg" else "aggregated"
            raise ConfigError(
                rr.blame(key),
                key,
                f"on one node the {label} servers need {need} GPUs ({names}), "
                f"but topology.gpus_per_node is {gpn}{_gpn_source(rr, key)}",
            )
        first = 0
        for w in members:
            own = list(range(first, first + w.devices))
            others = [d for d in range(gpn) if d not in own] if phase == "disagg" else []
            placed.append(dataclasses.replace(w, visible_devices=",".join(map(str, own + others))))
            first += w.devices
    return placed


def _aggregated_workers(rr: ResolvedRecipe, num_nodes: int, disagg: list[Worker]) -> list[Worker]:
    """The baseline's workers on the job's first nodes, with the disaggregated GPU count; a
    worker without its own cpu_bind takes that of the first disaggregated worker of its node."""
    disagg_devices = sum(w.devices for w in disagg)
    spec = rr.recipe.topology.aggregated
    if spec is None:
        return []
    key = "topology.aggregated"
    if spec.nodes > num_nodes:
        raise ConfigError(rr.blame(f"{key}.nodes"), f"{key}.nodes", f"{spec.nodes} nodes, but the job has {num_nodes}")
    workers, _ = _role_workers(rr, "aggregated", spec, 0, 0)
    binds: dict[int, str | None] = {}
    for d in disagg:
        binds.setdefault(d.node, d.cpu_bind)
    workers = [
        dataclasses.replace(w, side_channel_port=0, cpu_bind=w.cpu_bind or binds.get(w.node))  # no KV connector
        for w in workers
    ]
    devices = sum(w.devices for w in workers)
    # A baseline compares at the disaggregated GPU count; an aggregated-only job is a
    # deployment of its own (its results count its own GPUs), e.g. one instance as a reference.
    if devices != disagg_devices and not rr.recipe.topology.aggregated_only:
        raise ConfigError(
            rr.blame(key),
            key,
            f"the baseline uses {devices} GPU(s) (workers x tp x dp), the disaggregated servers "
            f"{disagg_devices}: compare at the same GPU count",
        )
    return workers


def _check_ports(rr: ResolvedRecipe, plan_: JobPlan, single_host: bool) -> None:
    used: dict[tuple[int, int], tuple[str, str]] = {}
    claims = [(n, w.port, w.name, f"topology.{w.role}.port") for w in plan_.workers for n in w.nodes]
    # A KV connector's side channel: one port per rank from the worker's base, on any of its
    # nodes (an aggregated worker has none). Its own HTTP port is a clash too.
    claims += [
        (n, w.side_channel_port + r, f"{w.name}'s KV side channel", "connector.side_channel_port")
        for w in plan_.workers
        if w.side_channel_port
        for n in w.nodes
        for r in range(w.devices)
    ]
    claims.append((plan_.proxy_node, rr.recipe.proxy.port, "proxy", "proxy.port"))
    if "vllm-router" in (rr.recipe.proxy.kind, *rr.recipe.proxy.arms):
        claims.append(
            (plan_.proxy_node, rr.recipe.proxy.router_metrics_port, "vllm-router's metrics", "proxy.metrics_port")
        )
    for node, port, owner, key in claims:
        slot = (0 if single_host else node, port)
        if slot in used and used[slot] != (owner, key):
            where = "on this host (the local launcher runs every node here)" if single_host else f"on node {node}"
            raise ConfigError(rr.blame(key), key, f"port {port} of {owner} is also used by {used[slot][0]} {where}")
        used[slot] = (owner, key)


def check_single_host(rr: ResolvedRecipe, plan_: JobPlan) -> None:
    """The local launcher runs all nodes on one host, so ports must differ job-wide and every
    core a cpu_bind names must be one this process may run on."""
    _check_ports(rr, plan_, single_host=True)
    cores = os.sched_getaffinity(0)
    for w in plan_.workers:
        missing = sorted(parse_cpus(w.cpu_bind) - cores) if w.cpu_bind else []
        if missing:
            key = f"topology.{w.role}.cpu_bind"
            raise ConfigError(
                rr.blame(key),
                key,
                f"{w.cpu_bind!r} of {w.name} names core(s) {', '.join(map(str, missing))}, which this host "
                f"(where the local launcher runs every node) does not give pdbench: it has {_cores(cores)}",
            )


def _cores(cores: set[int]) -> str:
    """{0, 1, 2, 5} -> 'cores 0-2,5'."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return "cores " + ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
