"""What each node of a job must check before it starts a server, decided at render time."""

from __future__ import annotations

from harness import kv_connectors
from harness.config.load import ResolvedRecipe
from harness.kv_connectors.entry import PortRange
from harness.render import commands as cmd
from harness.topology import JobPlan, PreflightSpec, Worker


def _flag(rr: ResolvedRecipe, role: str, name: str) -> object:
    model_flags = cmd.model_role_flags(rr, role)
    return {**model_flags, **getattr(rr.recipe.topology, role).flags}.get(name)


def _ports(rr: ResolvedRecipe, used: PortRange, w: Worker, rank: int, per_node: int, connected: bool) -> range:
    """The ports of one of the connector's port ranges that worker w binds on its rank-th node."""
    if w.role not in used.roles or (used.with_kv_transfer and not connected):
        return range(0)
    base = cmd.job_value(rr, used.base, w)
    assert isinstance(base, int), f"{rr.recipe.connector.name}: {used.base} is not a port"
    if used.per_rank:  # one port per rank of the worker on this node
        return range(base, base + per_node)
    return range(base, base + 1) if rank == 0 else range(0)  # on its HTTP leader only


def preflight_spec(rr: ResolvedRecipe, p: JobPlan, root: str) -> PreflightSpec:
    t, c = rr.recipe.topology, rr.recipe.connector
    entry = kv_connectors.get_kv(c.name)
    gpus: dict[int, int] = {}
    ports: dict[int, set[int]] = {}
    memory: dict[int, int] = {}
    # The phases run one after the other on the same nodes: a node needs the most GPUs and
    # memory of any one phase, and every port of every phase free at the start.
    for phase in p.phases:
        phase_gpus: dict[int, int] = {}
        phase_memory: dict[int, int] = {}
        for w in (w for w in p.workers if w.phase == phase):
            connected = w.role != "aggregated" and getattr(t, w.role).kv_transfer
            for rank, node in enumerate(w.nodes):
                if t.gpus_per_node:
                    phase_gpus[node] = min(t.gpus_per_node, phase_gpus.get(node, 0) + (w.devices // len(w.nodes)))
                mine = ports.setdefault(node, set())
                if rank == 0:
                    mine.add(w.port)
                per_node = max(1, w.devices // len(w.nodes))
                for used in entry.ports:
                    mine.update(_ports(rr, used, w, rank, per_node, connected))
                if not t.gpus_per_node:
                    env = cmd.server_env(rr, w)
                    space = env.get("VLLM_CPU_KVCACHE_SPACE")
                    if isinstance(space, str) and space.isdigit():
                        phase_memory[node] = phase_memory.get(node, 0) + int(space) * 2**30
        for node, n in phase_gpus.items():
            gpus[node] = max(gpus.get(node, 0), n)
        for node, n in phase_memory.items():
            memory[node] = max(memory.get(node, 0), n)
    profile = rr.recipe.benchmark.profile
    nsys_nodes: list[int] = []
    if profile is not None and profile.tool == "nsys":
        nsys_nodes = sorted({n for w in p.workers if w.role in profile.roles for n in w.nodes})
    ports.setdefault(p.proxy_node, set()).add(p.proxy_port)
    if rr.recipe.proxy.kind == "vllm-router":
        ports[p.proxy_node].add(rr.recipe.proxy.router_metrics_port)
    for value in entry.proxy.ports:
        port = cmd.job_value(rr, value)
        assert isinstance(port, int), f"{c.name}: the proxy's {value} is not a port"
        ports[p.proxy_node].add(port)
    roles = ("prefill", "decode", "aggregated") if t.aggregated else ("prefill", "decode")
    dummy = all(_flag(rr, role, "load-format") == "dummy" for role in roles)
    local = rr.model.path is not None or bool(rr.recipe.site.model_root)
    return PreflightSpec(
        weights_path=rr.relocated(rr.model_source, root) if local else None,
        hf_id=None if local else rr.model.hf_id,
        hf_cache=rr.recipe.site.hf_cache,
        need_weights=not dummy,
        gpus=gpus,
        ports={n: sorted(v) for n, v in sorted(ports.items())},
        memory_bytes=memory,
        rdma=bool(t.nic_detection and t.gpus_per_node and entry.rdma),
        nsys_nodes=nsys_nodes,
        node_interface=rr.recipe.site.node_interface,
    )
