"""The engine limits a prediction assumes (vLLM's max_num_seqs and max_num_batched_tokens), from a
recipe's or a run's resolved flags: the model's per-role flags under the recipe's role flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.rundir import LockUnreadable, RunDir

VLLM_MAX_NUM_SEQS = 256  # vLLM's online-serving defaults where the recipe sets neither
VLLM_MAX_BATCHED_TOKENS = 8192
# vLLM's CPU platform serves with smaller ones, per rank of the server's world (its TP):
# `vllm serve` on CPU defaults to 2048 tokens and 128 sequences (EngineArgs
# _set_default_max_num_seqs_and_batched_tokens, vLLM 0.32). A 1P1D job of 256-token prompts on the
# local cluster shows it: its prefill computes 8 prompts a batch (median TTFT 227 ms at C=8, 8 x
# 29 ms), not 32.
VLLM_CPU_MAX_NUM_SEQS = 128
VLLM_CPU_MAX_BATCHED_TOKENS = 2048
Limits = tuple[int, int]  # (max_num_seqs, max_batched_tokens)
DEFAULT: Limits = (VLLM_MAX_NUM_SEQS, VLLM_MAX_BATCHED_TOKENS)


class LimitsError(Exception):
    """A flag that is not a positive integer; the message names the key."""


def _flags(model: dict[str, Any], topology: dict[str, Any], role: str) -> dict[str, Any]:
    own = model.get(f"{role}_flags")
    if role == "aggregated" and own is None:
        own = model.get("decode_flags")
    return {**(own or {}), **((topology.get(role) or {}).get("flags") or {})}


def _int(flags: dict[str, Any], name: str, default: int, where: str) -> int:
    v = flags.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise LimitsError(f"{where}.flags.{name}: not a positive integer ({v!r})")
    return v


def _defaults(topology: dict[str, Any], role: str) -> Limits:
    """vLLM's defaults for the role's servers: its CPU platform's on CPU-only nodes."""
    if topology.get("gpus_per_node") == 0:
        world = int((topology.get(role) or {}).get("tp") or 1)
        return VLLM_CPU_MAX_NUM_SEQS * world, VLLM_CPU_MAX_BATCHED_TOKENS * world
    return DEFAULT


def limits(model: dict[str, Any], topology: dict[str, Any], phase: str, where: str = "topology") -> Limits:
    """Decode's sequences and prefill's batch tokens (disagg), or the aggregated servers' both."""
    if phase == "agg":
        f = _flags(model, topology, "aggregated")
        at = f"{where}.aggregated"
        seqs, tokens = _defaults(topology, "aggregated")
        return _int(f, "max-num-seqs", seqs, at), _int(f, "max-num-batched-tokens", tokens, at)
    seqs = _int(_flags(model, topology, "decode"), "max-num-seqs", _defaults(topology, "decode")[0], f"{where}.decode")
    tokens = _int(
        _flags(model, topology, "prefill"),
        "max-num-batched-tokens",
        _defaults(topology, "prefill")[1],
        f"{where}.prefill",
    )
    return seqs, tokens


def _lock(run: Path) -> dict[str, Any] | None:
    """A run's recipe.lock.yaml as loaded; None where it has none."""
    rd = RunDir(run)
    if not rd.lock.is_file():
        return None
    try:
        return rd.read_lock()
    except LockUnreadable as e:
        raise LimitsError(str(e)) from None


def kv_polled(run: Path) -> bool:
    """Whether a run's KV hand-off progressed only when vLLM polled, between its engine steps: its
    lock's connector ran without NIXL's progress thread (connector.progress_thread false)."""
    recipe = (_lock(run) or {}).get("recipe")
    connector = recipe.get("connector") if isinstance(recipe, dict) else None
    return isinstance(connector, dict) and connector.get("progress_thread") is False


def of_run(run: Path) -> dict[str, Limits]:
    """Per phase, the limits a run's servers had (its recipe.lock.yaml); {} where it has no lock."""
    lock = _lock(run)
    if lock is None:
        return {}
    lock_path = RunDir(run).lock
    try:
        model, topology = lock["model"], lock["recipe"]["topology"]
    except (KeyError, TypeError) as e:
        raise LimitsError(f"{lock_path}: unreadable as a recipe lock ({e})") from None
    where = f"{lock_path}: recipe.topology"
    out = {"disagg": limits(model, topology, "disagg", where)}
    if topology.get("aggregated"):
        out["agg"] = limits(model, topology, "agg", where)
    return out
