"""What each node of a job must check before it starts a server, decided at render time."""

from __future__ import annotations

from harness.config.load import ResolvedRecipe
from harness.render import commands as cmd
from harness.topology import JobPlan, PreflightSpec

# Connectors whose KV moves over RDMA on GPU nodes (the bundled connector uses TCP).
_RDMA_CONNECTORS = ("nixl", "moriio", "mooncake")


def _flag(rr: ResolvedRecipe, role: str, name: str) -> object:
    model_flags = rr.model.prefill_flags if role == "prefill" else rr.model.decode_flags
    return {**model_flags, **getattr(rr.recipe.topology, role).flags}.get(name)


def preflight_spec(rr: ResolvedRecipe, p: JobPlan, root: str) -> PreflightSpec:
    t, c = rr.recipe.topology, rr.recipe.connector
    gpus: dict[int, int] = {}
    ports: dict[int, set[int]] = {}
    memory: dict[int, int] = {}
    for w in p.workers:
        for rank, node in enumerate(w.nodes):
            if t.gpus_per_node:
                gpus[node] = min(t.gpus_per_node, gpus.get(node, 0) + (w.devices // len(w.nodes)))
            mine = ports.setdefault(node, set())
            if rank == 0:
                mine.add(w.port)
            per_node = max(1, w.devices // len(w.nodes))
            if c.name in ("nixl", "pdbench", "moriio") and getattr(t, w.role).kv_transfer:
                # One side-channel (KV, handshake) port per rank of the worker on this node.
                mine.update(range(w.side_channel_port, w.side_channel_port + per_node))
            if c.name == "moriio" and getattr(t, w.role).kv_transfer:
                notify = cmd.moriio_notify_port(rr, w)
                mine.update(range(notify, notify + per_node))
            if c.name == "mooncake" and w.role == "prefill" and rank == 0:
                mine.add(w.side_channel_port)  # its bootstrap server
            if not t.gpus_per_node:
                env = cmd.server_env(rr, w)
                space = env.get("VLLM_CPU_KVCACHE_SPACE")
                if isinstance(space, str) and space.isdigit():
                    memory[node] = memory.get(node, 0) + int(space) * 2**30
    ports.setdefault(p.proxy_node, set()).add(p.proxy_port)
    if c.name == "moriio":
        ports[p.proxy_node].add(c.proxy_ping_port)
    dummy = all(_flag(rr, role, "load-format") == "dummy" for role in ("prefill", "decode"))
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
