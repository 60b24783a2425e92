"""A pinned CPU server's OpenMP threads (harness.render.commands.server_env): one per core of its
rank's group, since in one engine process (models.yaml's CPU models) nobody else sets them and
torch's thread per machine core spins once the node pins the server to its group."""

from __future__ import annotations

from harness.config.load import load_recipe
from harness.render.commands import server_env
from harness.topology import plan


def _threads(*overrides: str) -> dict[str, object]:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", list(overrides), cluster="local")
    return {w.name: server_env(rr, w).get("OMP_NUM_THREADS") for w in plan(rr).workers}


def test_each_pinned_server_gets_a_thread_per_core_of_its_group() -> None:
    # Precondition: the local profile pins prefill to core 0 and each decode to core 1.
    assert _threads() == {"prefill-0": "1", "decode-0": "1", "decode-1": "1"}
    seen = _threads('topology.prefill.cpu_bind=["0-2,5"]', 'topology.decode.cpu_bind=["6,7", "8-11"]')
    assert seen == {"prefill-0": "4", "decode-0": "2", "decode-1": "4"}


def test_a_rank_group_counts_not_the_whole_bind() -> None:
    # Two ranks (TP 2), a core each: one thread per rank, as vLLM's own executor would set.
    seen = _threads("topology.prefill.tp=2", 'topology.prefill.cpu_bind=["0|1"]')
    assert seen["prefill-0"] == "1"


def test_a_set_value_wins_and_an_unpinned_server_gets_none() -> None:
    assert _threads('topology.prefill.env={"OMP_NUM_THREADS": "3"}')["prefill-0"] == "3"
    assert _threads("topology.prefill.cpu_bind=[]", "topology.decode.cpu_bind=[]") == {
        "prefill-0": None,
        "decode-0": None,
        "decode-1": None,
    }
