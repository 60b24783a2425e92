"""A search's candidates: the factors' product, each planned, the excluded ones with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from harness.config.overrides import parse_override
from harness.search import space
from harness.search.spec import LoadedSearch, load_search
from harness.submit.check import launcher_for, load, planned

DECODE = [
    {"topology.decode.workers": 1, "topology.decode.nodes": 1},
    {"topology.decode.workers": 2, "topology.decode.nodes": 2},
]
FACTORS: dict[str, Any] = {"prefill": [{"topology.prefill.workers": 1, "topology.prefill.nodes": 1}], "decode": DECODE}
BASE: dict[str, Any] = {
    "recipe": "tiny-fp32-cpu-nixl-1p2d",
    "cluster": "local",
    "factors": FACTORS,
    "slos": {"tight": {"ttft_p90": 800}},
    "concurrency": [1, 2, 4],
}


def search(tmp_path: Path, **changes) -> LoadedSearch:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}))
    return load_search(str(path))


def by_name(choices: list[space.Choice]) -> dict[str, space.Choice]:
    return {c.candidate.name: c for c in choices}


def test_the_local_search_plans_three_candidates_and_excludes_2p2d() -> None:
    s = load_search("local-tiny-pd")
    choices = space.candidates(s, cluster=s.cluster(None), launcher_kind="slurm")
    assert [c.candidate.name for c in choices] == ["1p1d", "1p2d", "2p1d", "2p2d"]
    got = {c.candidate.name: (c.candidate.devices, c.candidate.nodes, c.excluded) for c in choices}
    assert got["1p1d"] == (2, 2, None) and got["1p2d"] == (3, 3, None) and got["2p1d"] == (3, 3, None)
    assert got["2p2d"][:2] == (4, 4) and got["2p2d"][2] == "4 devices > constraints.max_devices 3"
    # The local cluster binds every prefill to core 0 and every decode to core 1: one core per role.
    one_2p1d = by_name(choices)["2p1d"].candidate
    assert (one_2p1d.prefill_devices, one_2p1d.decode_devices) == (2, 1)
    assert dict(one_2p1d.capacity) == {"prefill": 1.0, "decode": 1.0}


def test_each_candidate_carries_the_ladder_and_the_slo_search_last(tmp_path: Path) -> None:
    s = search(tmp_path, set=["benchmark.isl=128"], start=2)
    c = space.candidates(s, cluster="local")[1].candidate
    assert c.overrides[0] == "benchmark.isl=128"
    assert "topology.decode.workers=2" in c.overrides
    keys = [parse_override(o)[0] for o in c.overrides[-2:]]
    assert keys == [["benchmark", "concurrency"], ["benchmark", "slo_search"]]
    assert parse_override(c.overrides[-2])[1] == [1, 2, 4]
    slo_search = parse_override(c.overrides[-1])[1]
    assert slo_search == {
        "slos": {"tight": {"ttft_p90": 800.0}},
        "start": 2,
        "repeats": {"max": 2, "ci_half_width": 0.03, "confidence": 0.95},
    }


def test_a_candidate_that_does_not_plan_is_excluded_with_the_error(tmp_path: Path) -> None:
    bad = {"topology.decode.workers": 3, "topology.decode.nodes": 2}
    s = search(tmp_path, factors={"decode": [DECODE[0], bad]})
    choices = by_name(space.candidates(s, cluster="local"))
    assert choices["1p1d"].excluded is None
    reason = choices["1p3d"].excluded
    assert reason is not None and "topology.decode" in reason and "multiple of nodes" in reason
    assert choices["1p3d"].candidate.devices == 0


def test_a_candidate_the_launcher_cannot_run_is_excluded(tmp_path: Path) -> None:
    # The local launcher runs every node on this host, where a role's workers take consecutive
    # ports: 1P2D runs there (decode 8200 and 8201); a decode port inside prefill's collides.
    clash = {**DECODE[1], "topology.decode.port": 8100}
    s = search(tmp_path, factors={"decode": [*DECODE, clash]})
    choices = by_name(space.candidates(s, cluster="local", launcher_kind="local"))
    assert choices["1p1d-nodes1_workers1"].excluded is None
    assert choices["1p2d-nodes2_workers2"].excluded is None
    reason = choices["1p2d-nodes2_port8100_workers2"].excluded or ""
    assert "port 8100 of decode-0 is also used by prefill-0 on this host" in reason, reason


def test_other_varying_factors_are_named_after_their_values(tmp_path: Path) -> None:
    s = search(tmp_path, factors={**FACTORS, "shape": [{"benchmark.isl": 128}, {"benchmark.isl": 512}]})
    names = [c.candidate.name for c in space.candidates(s, cluster="local")]
    assert names == ["1p1d-isl128", "1p1d-isl512", "1p2d-isl128", "1p2d-isl512"]


def test_the_max_nodes_constraint_excludes(tmp_path: Path) -> None:
    s = search(tmp_path, constraints={"max_nodes": 2})
    assert by_name(space.candidates(s, cluster="local"))["1p2d"].excluded == "3 nodes > constraints.max_nodes 2"


def test_the_aggregated_baseline_uses_the_winners_devices_and_nodes(tmp_path: Path) -> None:
    s = search(tmp_path, baseline={"set": ["topology.aggregated.port=8300"]})
    winner = by_name(space.candidates(s, cluster="local"))["1p2d"].candidate
    choice = space.baseline(s, winner, cluster="local", launcher_kind="slurm")
    assert choice.excluded is None
    b = choice.candidate
    assert (b.name, b.kind, b.devices, b.prefill_devices, b.decode_devices, b.nodes) == ("agg3", "agg", 3, 3, 0, 3)
    # Its three instances run on the disaggregated servers' cores: 0 and 1.
    assert dict(b.capacity) == {"aggregated": 2.0}
    assert b.overrides[: len(winner.overrides)] == winner.overrides
    extra = dict(o.split("=", 1) for o in b.overrides[len(winner.overrides) :])
    assert json.loads(extra["topology.aggregated_only"]) is True
    assert (extra["topology.aggregated.workers"], extra["topology.aggregated.nodes"]) == ("3", "3")
    assert extra["topology.aggregated.port"] == "8300"


def test_a_baseline_without_a_port_is_excluded_with_the_reason(tmp_path: Path) -> None:
    s = search(tmp_path)
    winner = space.candidates(s, cluster="local")[0].candidate
    choice = space.baseline(s, winner, cluster="local")
    assert choice.candidate.name == "agg2"
    assert "topology.aggregated.port" in (choice.excluded or "")


def test_one_baseline_per_device_count() -> None:
    def c(name: str, p: int, d: int) -> space.Candidate:
        return space.Candidate(name, "disagg", (), p, d, p + d, {})

    picked = space.device_counts([c("1p2d", 1, 2), c("2p1d", 2, 1), c("1p1d", 1, 1)])
    assert [x.name for x in picked] == ["1p2d", "1p1d"]


def test_the_local_launcher_keeps_every_topology_and_the_baseline_on_one_host(tmp_path: Path) -> None:
    # `pdbench search local-tiny-pd --launcher local` runs every node on this host: a role's
    # workers take its port plus their index, so neither 1P2D, 2P1D, 2P2D nor the N-replica
    # baseline shares a port; only the search's own constraints exclude (local-tiny-pd's
    # max_devices 3 excludes 2P2D, lifted here).
    shipped = load_search("local-tiny-pd")
    kept = {c.candidate.name: c.excluded for c in space.candidates(shipped, cluster="local", launcher_kind="local")}
    assert kept == {"1p1d": None, "1p2d": None, "2p1d": None, "2p2d": "4 devices > constraints.max_devices 3"}
    prefill = [{"topology.prefill.workers": n, "topology.prefill.nodes": n} for n in (1, 2)]
    s = search(
        tmp_path, factors={"prefill": prefill, "decode": DECODE}, baseline={"set": ["topology.aggregated.port=8300"]}
    )
    choices = space.candidates(s, cluster="local", launcher_kind="local")
    assert {c.candidate.name: c.excluded for c in choices} == {"1p1d": None, "1p2d": None, "2p1d": None, "2p2d": None}
    ports = {c.candidate.name: _ports_on_one_host(s, c.candidate) for c in choices}
    assert ports["2p2d"] == {
        "prefill-0": 8100, "prefill-1": 8101, "decode-0": 8200, "decode-1": 8201, "proxy": 30000,
        "prefill-0 kv": 5600, "prefill-1 kv": 5601, "decode-0 kv": 5602, "decode-1 kv": 5603,
    }  # fmt: skip
    assert ports["2p1d"]["prefill-1"] == 8101 and ports["1p2d"]["decode-1"] == 8201
    # Precondition: on Slurm each node gives its first worker the role's port, which one host
    # could not (what the search used to exclude these candidates for).
    slurm = planned(load(s.spec.recipe, list(by_name(choices)["2p2d"].candidate.overrides), "local")).plan
    assert [w.port for w in slurm.role("decode")] == [8200, 8200]
    for name, used in ports.items():
        assert len(set(used.values())) == len(used), (name, used)  # one host: no port twice

    # The baseline at each device count: N whole replicas, each on its own port, on the
    # disaggregated servers' cores (prefill's nodes on core 0, decode's on core 1).
    for winner, replicas in (("1p2d", 3), ("2p2d", 4)):
        choice = space.baseline(s, by_name(choices)[winner].candidate, cluster="local", launcher_kind="local")
        assert choice.excluded is None, choice.excluded
        b = choice.candidate
        assert (b.name, b.devices, dict(b.capacity)) == (f"agg{replicas}", replicas, {"aggregated": 2.0})
        agg = _ports_on_one_host(s, b)
        assert agg == {**{f"aggregated-{i}": 8300 + i for i in range(replicas)}, "proxy": 30000}


def _ports_on_one_host(s: LoadedSearch, c: space.Candidate) -> dict[str, int]:
    """Every port the candidate's job listens on under the local launcher, by owner (an
    aggregated-only job starts no disaggregated server)."""
    rr = load(s.spec.recipe, list(c.overrides), "local")
    p = planned(rr, launcher_for("local", rr)).plan
    workers = [w for w in p.workers if w.phase in p.phases]
    kv = {f"{w.name} kv": w.side_channel_port + r for w in workers if w.side_channel_port for r in range(w.devices)}
    return {w.name: w.port for w in workers} | {"proxy": p.proxy_port} | kv
