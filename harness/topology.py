"""The recipe's xP+yD topology as typed data: workers, their nodes, ports and devices.

Templates only print what this module decides (no index arithmetic in bash).
Nodes are numbered as Slurm numbers them: prefill nodes first (node 0 also runs the
proxy and the benchmark client), then decode nodes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, Optional

from harness.config.load import ConfigError, ResolvedRecipe
from harness.config.schema import RoleSpec

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


@dataclass(frozen=True)
class Worker:
    role: Role
    index: int  # within its role
    node: int
    local_index: int  # among the workers of its role on that node
    port: int
    side_channel_port: int  # NIXL: base of this worker's per-rank ports
    devices: int  # accelerators (or CPU "devices") this worker uses: tp x dp
    visible_devices: Optional[str]  # e.g. "0,1,2,3"; None when the worker owns the node
    cpu_bind: Optional[str]

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class JobPlan:
    num_nodes: int
    workers: tuple[Worker, ...]
    proxy_node: int = 0

    def role(self, role: Role) -> list[Worker]:
        return [w for w in self.workers if w.role == role]

    def on_node(self, node: int) -> list[Worker]:
        return [w for w in self.workers if w.node == node]

    def devices(self, role: Role) -> int:
        return sum(w.devices for w in self.role(role))

    def to_json(self) -> dict:
        return {
            "num_nodes": self.num_nodes,
            "proxy_node": self.proxy_node,
            "workers": [dict(asdict(w), name=w.name) for w in self.workers],
        }


def _role_workers(
    rr: ResolvedRecipe, role: Role, spec: RoleSpec, first_node: int, side_port: int
) -> tuple[list[Worker], int]:
    key = f"topology.{role}"
    if spec.workers < spec.nodes:
        raise ConfigError(
            rr.recipe_file, key,
            f"{spec.workers} worker(s) on {spec.nodes} nodes means a worker spans several nodes, "
            "which this version does not launch yet; use workers >= nodes",
        )
    if spec.workers % spec.nodes:
        raise ConfigError(rr.recipe_file, key, f"workers ({spec.workers}) must be a multiple of nodes ({spec.nodes})")
    per_node = spec.workers // spec.nodes
    gpn = rr.recipe.topology.gpus_per_node
    if gpn and per_node * spec.gpus_per_worker > gpn:
        raise ConfigError(
            rr.recipe_file, key,
            f"{per_node} worker(s) per node x tp*dp {spec.gpus_per_worker} needs "
            f"{per_node * spec.gpus_per_worker} GPUs, but topology.gpus_per_node is {gpn}",
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
                role=role, index=i, node=first_node + i // per_node, local_index=local,
                port=spec.port + local, side_channel_port=side_port,
                devices=spec.gpus_per_worker, visible_devices=visible,
                cpu_bind=spec.cpu_bind[i % len(spec.cpu_bind)] if spec.cpu_bind else None,
            )
        )
        # NIXL uses base + dp_rank*tp + tp_rank per rank; keep every worker's range disjoint
        # so that instances sharing a host (the local launcher) never collide.
        side_port += spec.gpus_per_worker
    return workers, side_port


def plan(rr: ResolvedRecipe) -> JobPlan:
    topo = rr.recipe.topology
    side = rr.recipe.connector.side_channel_port
    prefill, side = _role_workers(rr, "prefill", topo.prefill, 0, side)
    decode, _ = _role_workers(rr, "decode", topo.decode, topo.prefill.nodes, side)
    plan_ = JobPlan(num_nodes=topo.prefill.nodes + topo.decode.nodes, workers=tuple(prefill + decode))
    _check_ports(rr, plan_, single_host=False)
    return plan_


def _check_ports(rr: ResolvedRecipe, plan_: JobPlan, single_host: bool) -> None:
    used: dict[tuple[int, int], str] = {}
    claims = [(w.node, p, w.name, f"topology.{w.role}.port") for w in plan_.workers
              for p in (w.port, w.side_channel_port)]
    claims.append((plan_.proxy_node, rr.recipe.proxy.port, "proxy", "proxy.port"))
    for node, port, owner, key in claims:
        slot = (0 if single_host else node, port)
        if slot in used and used[slot] != owner:
            where = "on this host (the local launcher runs every node here)" if single_host else f"on node {node}"
            raise ConfigError(rr.recipe_file, key, f"port {port} of {owner} is also used by {used[slot]} {where}")
        used[slot] = owner


def check_single_host(rr: ResolvedRecipe, plan_: JobPlan) -> None:
    """The local launcher runs all nodes on one host, so ports must differ job-wide."""
    _check_ports(rr, plan_, single_host=True)
