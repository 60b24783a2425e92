"""What each node of a job must check before it starts a server, decided at render time."""

from __future__ import annotations

from harness.config.load import ResolvedRecipe
from harness.render import commands as cmd
from harness.topology import JobPlan, PreflightSpec

# Connectors whose KV moves over RDMA on GPU nodes (the bundled connector uses TCP).
_RDMA_CONNECTORS = ("nixl", "moriio", "mooncake")


def _flag(rr: ResolvedRecipe, role: str, name: str) -> object:
    model_flags = cmd.model_role_flags(rr, role)
    return {**model_flags, **getattr(rr.recipe.topology, role).flags}.get(name)


def preflight_spec(rr: ResolvedRecipe, p: JobPlan, root: str) -> PreflightSpec:
    t, c = rr.recipe.topology, rr.recipe.connector
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
                if c.name in ("nixl", "pdbench", "moriio") and connected:
                    # One side-channel (KV, handshake) port per rank of the worker on this node.
                    mine.update(range(w.side_channel_port, w.side_channel_port + per_node))
                if c.name == "moriio" and connected:
                    notify = cmd.moriio_notify_port(rr, w)
                    mine.update(range(notify, notify + per_node))
                if c.name == "mooncake" and w.role == "prefill" and rank == 0:
                    mine.add(w.side_channel_port)  # its bootstrap server
                if not t.gpus_per_node:
                    env = cmd.server_env(rr, w)
                    space = env.get("VLLM_CPU_KVCACHE_SPACE")
                    if isinstance(space, str) and space.isdigit():
                        phase_memory[node] = phase_memory.get(node, 0) + int(space) * 2**30
        for node, n in phase_gpus.items():
            gpus[node] = max(gpus.get(node, 0), n)
        for node, n in phase_memory.items():
            memory[node] = max(memory.get(node, 0), n)
    ports.setdefault(p.proxy_node, set()).add(p.proxy_port)
    if c.name == "moriio":
        ports[p.proxy_node].add(c.proxy_ping_port)
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
        rdma=bool(t.nic_detection and t.gpus_per_node and c.name in _RDMA_CONNECTORS),
        node_interface=rr.recipe.site.node_interface,
    )
