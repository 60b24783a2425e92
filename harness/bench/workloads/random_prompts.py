"""dataset `random`: prompts of exact random lengths, with an optional shared prefix."""

from __future__ import annotations

import numpy as np

from harness.bench.client_config import ClientConfig
from harness.bench.dataset import SampleRequest, make_prefix, sample_requests
from harness.bench.scope import PREFIX
from harness.bench.tokenizer import PromptTokenizer
from harness.bench.workloads.base import IndependentRequests


class RandomPrompts(IndependentRequests):
    def __init__(self) -> None:
        super().__init__()
        self.prefix = ""  # random_prefix_len tokens every prompt starts with

    def start(self, base: ClientConfig, tokenizer: PromptTokenizer) -> None:
        super().start(base, tokenizer)
        if base.random_prefix_len:
            self.prefix = make_prefix(tokenizer, base.random_prefix_len, np.random.default_rng([base.seed, 0, PREFIX]))

    def sample(self, cfg: ClientConfig, count: int, rng: np.random.Generator) -> list[SampleRequest]:
        assert cfg.isl is not None and cfg.osl is not None  # set per shape
        return sample_requests(
            self._tokenizer(),
            count,
            cfg.isl,
            cfg.osl,
            cfg.range_ratio,
            cfg.range_ratio_convention,
            rng,
            prefix=self.prefix,
            prefix_len=cfg.random_prefix_len,
        )
