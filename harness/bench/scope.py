"""What a point runs under: the shape's config, its tag, the SLO search's repeat, and its seeds.

A sweep of several shapes runs each point under its shape's config (the base config with the
shape's isl, osl and range_ratio); an SLO search's repeat under its own metrics and sentinels
folders. Everything seeded for a point draws from a sub-stream of the seed keyed by the scope,
so a point's prompts do not depend on which other points are in the sweep, and points never
repeat each other's prompts (a repeat would hit the server's prefix cache and flatter TTFT).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.bench.client_config import ClientConfig
from harness.config.benchmark import Shape
from harness.rundir.paths import repeat_subdir
from harness.rundir.result_name import point_tag

# Seed sub-streams per point. The shared prefix uses concurrency 0, which no point has. A
# profiled window's prompts are its own (PROFILE): the measured ones again would hit the prefix cache.
MAIN, WARMUP, ARRIVALS, PREFIX, SENTINEL, PROFILE = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Scope:
    cfg: ClientConfig  # the base config with the running shape's isl, osl and range_ratio
    shape_tag: str | None  # the shape's tag in a several-shape sweep, else None
    repeat: int = 0  # an SLO search's repeat of the point (0: its first measurement)

    @classmethod
    def of_shape(cls, base: ClientConfig, shape: Shape) -> Scope:
        cfg = base.model_copy(
            update={"isl": shape.isl, "osl": shape.osl, "range_ratio": shape.range_ratio, "shapes": []}
        )
        return cls(cfg, shape.tag if base.multi_shape else None)

    def for_repeat(self, base: ClientConfig, repeat: int) -> Scope:
        """A repeat's scope: its metrics and sentinels under repeats/<k>/, its prompts its own."""
        where = repeat_subdir(repeat)
        cfg = self.cfg.model_copy(
            update={"metrics_dir": f"{where}/{base.metrics_dir}", "sentinels_dir": f"{where}/{base.sentinels_dir}"}
        )
        return Scope(cfg, self.shape_tag, repeat)

    def seed_key(self, concurrency: int, stream: int) -> list[int]:
        # In a several-shape sweep the shape is part of the key: the same concurrency of two
        # shapes must not share prompt tokens (a shared start would hit the prefix cache).
        assert self.cfg.isl is not None and self.cfg.osl is not None
        shape = [self.cfg.isl, self.cfg.osl] if self.shape_tag else []
        # A repeat sends prompts of its own: the first measurement's would hit the prefix cache.
        return [self.cfg.seed, *shape, concurrency, stream, *([self.repeat] if self.repeat else [])]

    def rng(self, concurrency: int, stream: int) -> np.random.Generator:
        return np.random.default_rng(self.seed_key(concurrency, stream))

    def text(self) -> str:
        """The shape in a log line of a several-shape sweep."""
        return f" {self.cfg.isl}/{self.cfg.osl}" if self.shape_tag else ""

    def label(self, concurrency: int) -> str:
        return f"C={concurrency}{self.text()}"

    def tag(self, concurrency: int) -> str:
        return point_tag(concurrency, self.shape_tag)
