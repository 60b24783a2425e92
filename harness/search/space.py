"""A search's candidates: the Cartesian product of its factors, each a planned recipe.

Each candidate is loaded and planned as `pdbench submit` would (harness.submit.check), which
gives its devices, nodes and per-role capacity; one that does not load or plan, or breaks the
search's constraints, is kept as excluded with the error's text. The aggregated baseline at a
winner's device count is a candidate too, of kind "agg".
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.config.cpus import parse_cpus
from harness.search.spec import LoadedSearch, SearchSpec
from harness.submit.check import Planned, launcher_for, load, planned
from harness.submit.refused import Refused
from harness.topology import Role


@dataclass(frozen=True)
class Candidate:
    name: str  # "1p2d" (+ "-<other factor values>" when other factors vary); a safe folder name
    kind: Literal["disagg", "agg"]
    overrides: tuple[str, ...]  # --set overrides making this candidate from the base recipe (search ones included)
    prefill_devices: int  # agg: all its devices here, decode_devices 0
    decode_devices: int
    nodes: int
    capacity: Mapping[str, float]  # role -> compute units: GPU sites devices; CPU sites (gpus_per_node 0) the
    # distinct cores in the role's cpu_bind (else its workers); keys prefill/decode or aggregated

    @property
    def devices(self) -> int:
        return self.prefill_devices + self.decode_devices


@dataclass(frozen=True)
class Choice:
    """A candidate of the grid and, when it cannot run, why (the error's text or the constraint)."""

    candidate: Candidate
    excluded: str | None = None


# The factor keys that the xPyD part of a candidate's name already says.
_TOPOLOGY_KEYS = frozenset(f"topology.{r}.{k}" for r in ("prefill", "decode") for k in ("workers", "nodes"))
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def search_overrides(spec: SearchSpec) -> list[str]:
    """What makes every candidate's job a ladder search under the search's SLOs (last: they win)."""
    slo_search = {
        "slos": spec.slos,
        "start": spec.start_value,
        "repeats": spec.repetitions.model_dump(mode="json"),
    }
    return [f"benchmark.concurrency={json.dumps(spec.concurrency)}", f"benchmark.slo_search={json.dumps(slo_search)}"]


def override(key: str, value: Any) -> str:
    # JSON is YAML, which is how --set parses a value: types survive the trip.
    return f"{key}={json.dumps(value)}"


def candidates(search: LoadedSearch, *, cluster: str | None, launcher_kind: str | None = None) -> list[Choice]:
    """Every combination of the factors in grid order (the first factor varies slowest)."""
    spec = search.spec
    factors = list(spec.factors.items())
    varying = [i for i, (_, alts) in enumerate(factors) if len(alts) > 1]
    named = [i for i in varying if not set().union(*(a.keys() for a in factors[i][1])) <= _TOPOLOGY_KEYS]
    base = _base_values(spec, cluster)
    out: list[Choice] = []
    seen: dict[str, int] = {}
    for combo in itertools.product(*(alts for _, alts in factors)):
        chosen = [override(k, v) for alt in combo for k, v in alt.items()]
        overrides = (*spec.set, *chosen, *search_overrides(spec))
        values = {**base, **{k: v for alt in combo for k, v in alt.items()}}
        name = f"{values['topology.prefill.workers']}p{values['topology.decode.workers']}d"
        name += "".join(f"-{_label(combo[i])}" for i in named)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name += f"-{seen[name]}"
        out.append(_choose(spec, name, "disagg", overrides, cluster, launcher_kind))
    return out


def _base_values(spec: SearchSpec, cluster: str | None) -> dict[str, Any]:
    """The base recipe's xPyD (with the search's overrides), for the names of candidates that do not load."""
    rr = load(spec.recipe, [*spec.set, *search_overrides(spec)], cluster)
    topo = rr.recipe.topology
    return {"topology.prefill.workers": topo.prefill.workers, "topology.decode.workers": topo.decode.workers}


def _label(alternative: Mapping[str, Any]) -> str:
    """{topology.decode.tp: 2} -> 'tp2'; several keys joined by '_'."""
    parts = [
        f"{k.rsplit('.', 1)[-1]}{v if not isinstance(v, (list, dict)) else json.dumps(v)}"
        for k, v in alternative.items()
    ]
    return _UNSAFE.sub("", "_".join(parts)) or "x"


def _choose(
    spec: SearchSpec,
    name: str,
    kind: Literal["disagg", "agg"],
    overrides: Sequence[str],
    cluster: str | None,
    launcher_kind: str | None,
) -> Choice:
    try:
        rr = load(spec.recipe, list(overrides), cluster)
        p = planned(rr, launcher_for(launcher_kind, rr) if launcher_kind else None)
    except Refused as e:
        return Choice(Candidate(name, kind, tuple(overrides), 0, 0, 0, {}), str(e))
    candidate = _candidate(p, name, kind, overrides)
    return Choice(candidate, _broken_constraint(spec, candidate))


def _candidate(p: Planned, name: str, kind: Literal["disagg", "agg"], overrides: Sequence[str]) -> Candidate:
    roles: tuple[Role, ...] = ("aggregated",) if kind == "agg" else ("prefill", "decode")
    capacity: dict[str, float] = {role: _capacity(p, role) for role in roles}
    if kind == "agg":
        return Candidate(name, kind, tuple(overrides), p.plan.devices("aggregated"), 0, p.plan.num_nodes, capacity)
    return Candidate(
        name, kind, tuple(overrides), p.plan.devices("prefill"), p.plan.devices("decode"), p.plan.num_nodes, capacity
    )


def _capacity(p: Planned, role: Role) -> float:
    """GPU sites: the role's devices; CPU sites: the distinct cores its workers are bound to
    (else its workers), since workers bound to one core share it."""
    workers = p.plan.role(role)
    if p.rr.recipe.topology.gpus_per_node:
        return float(sum(w.devices for w in workers))
    binds = [w.cpu_bind for w in workers if w.cpu_bind]
    if not binds:
        return float(len(workers))
    return float(len(set().union(*(parse_cpus(b) for b in binds))))


def _broken_constraint(spec: SearchSpec, c: Candidate) -> str | None:
    limits = spec.constraints
    if limits.max_devices is not None and c.devices > limits.max_devices:
        return f"{c.devices} devices > constraints.max_devices {limits.max_devices}"
    if limits.max_nodes is not None and c.nodes > limits.max_nodes:
        return f"{c.nodes} nodes > constraints.max_nodes {limits.max_nodes}"
    return None


def baseline(
    search: LoadedSearch, winner: Candidate, *, cluster: str | None, launcher_kind: str | None = None
) -> Choice:
    """The aggregated baseline at the winner's device count, on the winner's nodes: instances
    of the decode role's tp x dp (one device each where that does not divide the count), with
    the search's baseline.set last."""
    spec = search.spec
    devices = winner.devices
    name = f"agg{devices}"
    try:
        topo = load(spec.recipe, list(winner.overrides), cluster).recipe.topology
    except Refused as e:
        return Choice(Candidate(name, "agg", winner.overrides, 0, 0, 0, {}), str(e))
    tp, dp = topo.decode.tp, topo.decode.dp
    if devices % (tp * dp):
        tp, dp = 1, 1
    workers = devices // (tp * dp)
    # The baseline runs on the job's first nodes; workers spread evenly over as many as divide them.
    nodes = max(n for n in range(1, min(workers, winner.nodes) + 1) if workers % n == 0)
    overrides = (
        *winner.overrides,
        override("topology.aggregated_only", True),
        override("topology.aggregated.workers", workers),
        override("topology.aggregated.nodes", nodes),
        override("topology.aggregated.tp", tp),
        override("topology.aggregated.dp", dp),
        *spec.baseline.set,
    )
    return _choose(spec, name, "agg", overrides, cluster, launcher_kind)


def device_counts(winners: Sequence[Candidate]) -> list[Candidate]:
    """One winner per distinct device count, in the order given: a baseline job each."""
    out: dict[int, Candidate] = {}
    for c in winners:
        out.setdefault(c.devices, c)
    return list(out.values())
