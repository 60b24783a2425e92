"""The search file (searches/<name>.yaml or a path): its model, loaded and checked.

Every error is a harness.config ConfigError naming the search file and the key path, as a
recipe's errors do. SLO bounds are checked by harness.config.slo, their one owner.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, ValidationError, field_validator, model_validator

from harness.config.load import PROJECT_ROOT, ConfigError, _read_yaml, _validation_error
from harness.config.overrides import parse_override
from harness.config.schema import SAFE_NAME
from harness.config.slo import SLOError, check_bounds
from harness.strict import FrozenStrict

SEARCHES = "searches"
# A dotted recipe key, as `--set` takes it.
_RECIPE_KEY = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*")


class Constraints(FrozenStrict):
    max_devices: PositiveInt | None = Field(None, description="leave out candidates using more devices")
    max_nodes: PositiveInt | None = Field(None, description="leave out candidates using more nodes")


class Repetitions(FrozenStrict):
    max: int = Field(2, ge=0, description="extra measurements of each SLO's best concurrency")
    ci_half_width: float = Field(0.03, gt=0, description="stop repeating below this relative half-width")
    confidence: float = Field(0.95, gt=0, lt=1, description="confidence of the t-interval")


class Budget(FrozenStrict):
    max_jobs: PositiveInt | None = Field(None, description="jobs launched at most (baseline included)")
    device_hours: float | None = Field(None, gt=0, description="devices x wall hours spent at most")
    nodes_in_flight: PositiveInt | None = Field(None, description="nodes of the jobs running at once, at most")


class Baseline(FrozenStrict):
    aggregated: bool = Field(True, description="measure the aggregated baseline at each winner's device count")
    set: list[str] = Field([], description="overrides of the baseline's job only")


class Prune(FrozenStrict):
    enabled: bool = Field(True, description="skip candidates the finished ones show cannot win")
    slack: float = Field(1.1, ge=1, description="a candidate is skipped only when it loses by more than this")


class SearchSpec(FrozenStrict):
    description: str = ""
    recipe: str = Field(description="the base recipe (name or path)")
    cluster: str | None = Field(None, description="cluster profile of every candidate")
    set: list[str] = Field([], description="overrides of every candidate")
    factors: dict[str, list[dict[str, Any]]] = Field(
        description="factor -> its alternatives, each a map of recipe keys; the candidates are their product"
    )
    constraints: Constraints = Constraints()
    # Any: harness.config.slo.check_bounds judges the bounds and says what is wrong with one.
    slos: dict[str, dict[str, Any]] = Field(description="SLO name -> bounds (<metric>_<stat>: ms)")
    concurrency: list[PositiveInt] = Field(description="the ladder, ascending")
    start: PositiveInt | None = Field(None, description="a ladder value (default the first)")
    repetitions: Repetitions = Repetitions()
    budget: Budget = Budget()
    baseline: Baseline = Baseline()
    prune: Prune = Prune()
    predict: Literal["off", "order", "prune", "prune-all"] = Field(
        "prune",
        description="use the prediction from the first measured candidate: off, order the rest by it, prune by it "
        "(never where it extrapolates), or prune-all (extrapolating too); harness/search/foresee.py",
    )

    @field_validator("predict", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        """YAML reads an unquoted `off` (and `no`) as false: that is the mode off. True names no mode."""
        if v is False:
            return "off"
        if v is True:
            raise ValueError("true names no mode: say off, order, prune or prune-all")
        return v

    @model_validator(mode="after")
    def _check(self) -> SearchSpec:
        ladder = self.concurrency
        if not ladder:
            raise ValueError("concurrency: give the ladder, e.g. [1, 2, 4, 8]")
        if any(b <= a for a, b in itertools.pairwise(ladder)):
            raise ValueError(f"concurrency: the ladder must be ascending and unique (got {ladder})")
        if self.start is not None and self.start not in ladder:
            raise ValueError(f"start: {self.start} is not a value of the ladder {ladder}")
        if not self.factors:
            raise ValueError("factors: give at least one factor with its alternatives")
        for factor, alternatives in self.factors.items():
            if not SAFE_NAME.fullmatch(factor):
                raise ValueError(f"factors: {factor!r} is not a safe name (letters, digits, '.', '_', '-')")
            if not alternatives:
                raise ValueError(f"factors: {factor!r} has no alternatives")
            for i, alt in enumerate(alternatives):
                if not alt:
                    raise ValueError(f"factors: {factor}[{i}] sets no recipe key")
                bad = [k for k in alt if not _RECIPE_KEY.fullmatch(str(k))]
                if bad:
                    raise ValueError(f"factors: {factor}[{i}]: {bad[0]!r} is not a dotted recipe key")
        if not self.slos:
            raise ValueError("slos: give at least one SLO, e.g. {tight: {ttft_p90: 800, tpot_p90: 40}}")
        return self

    @property
    def start_value(self) -> int:
        return self.start if self.start is not None else self.concurrency[0]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class LoadedSearch:
    name: str  # the file's stem: results/searches/<name>/ by default
    path: Path
    spec: SearchSpec

    @property
    def hash(self) -> str:
        return spec_hash(self.spec)

    def cluster(self, explicit: str | None) -> str | None:
        """--cluster wins over the search file's; without either, $PDBENCH_CLUSTER (as for submit)."""
        return explicit if explicit is not None else self.spec.cluster


def spec_hash(spec: SearchSpec) -> str:
    canonical = json.dumps(spec.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def search_path(ref: str, root: Path = PROJECT_ROOT) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return root / SEARCHES / f"{ref}.yaml"


def load_search(ref: str, root: Path = PROJECT_ROOT) -> LoadedSearch:
    """The search file by name (searches/<name>.yaml) or path; ConfigError naming the file and key."""
    path = search_path(ref, root)
    if not path.is_file():
        available = sorted(p.stem for p in (root / SEARCHES).glob("*.yaml"))
        raise ConfigError(path, "", f"search file not found (available: {', '.join(available) or 'none'})")
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping of search keys")
    try:
        spec = SearchSpec.model_validate(data)
    except ValidationError as e:
        raise _validation_error(SearchSpec, path, e) from None
    if not SAFE_NAME.fullmatch(path.stem):
        raise ConfigError(path, "", f"the file name {path.stem!r} is not a safe name (letters, digits, '.', '_', '-')")
    spec = spec.model_copy(update={"slos": _checked_slos(path, spec.slos)})
    for key, overrides in (("set", spec.set), ("baseline.set", spec.baseline.set)):
        for i, text in enumerate(overrides):
            try:
                parse_override(text)
            except ConfigError as e:
                raise ConfigError(path, f"{key}[{i}]", e.expected) from None
    return LoadedSearch(path.stem, path.resolve(), spec)


def _checked_slos(path: Path, slos: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, bounds in slos.items():
        if not name.replace("-", "_").isidentifier():
            raise ConfigError(path, f"slos.{name}", "an SLO's name is a word (letters, digits, - and _)")
        try:
            out[name] = check_bounds(bounds, f"slos.{name}")
        except SLOError as e:
            key, _, why = str(e).partition(": ")
            raise ConfigError(path, key, why) from None
    return out
