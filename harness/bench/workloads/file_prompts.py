"""datasets `jsonl` and `sharegpt`: prompts from a file, in a seeded order."""

from __future__ import annotations

import numpy as np

from harness.bench.client_config import ClientConfig
from harness.bench.dataset import FileRecord, SampleRequest, load_records, sample_file_requests
from harness.bench.workloads.base import IndependentRequests


class FilePrompts(IndependentRequests):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[FileRecord] = []

    def load(self, base: ClientConfig) -> None:
        assert base.dataset in ("jsonl", "sharegpt") and base.dataset_path is not None  # the config's check
        self.records = load_records(base.dataset_path, base.dataset)

    def sample(self, cfg: ClientConfig, count: int, rng: np.random.Generator) -> list[SampleRequest]:
        assert cfg.osl is not None  # set per shape
        return sample_file_requests(self._tokenizer(), self.records, count, cfg.osl, rng)
