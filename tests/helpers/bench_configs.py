"""ClientConfigs of the bench tests against the fake server (tests/helpers/bench_fake_server.py)."""

from __future__ import annotations

from pathlib import Path

from harness.bench import ClientConfig

SENTINEL_PROMPTS = 20  # measured requests per point: 4 sentinels (the minimum) leave after 0, 4.5, 9 and 13.5 of them


def sentinel_config(model_dir: str, result_dir: Path, target: str, reference: str | None, **kw) -> ClientConfig:
    base = dict(
        base_url=target,
        model="tiny",
        tokenizer=model_dir,
        isl=32,
        osl=8,
        concurrency=[2],
        num_prompts=SENTINEL_PROMPTS,
        num_warmups=0,
        result_dir=str(result_dir),
        prefill_gpus=1,
        decode_gpus=1,
        scrape=[f"prefill-0=prefill@{reference}"] if reference else [],
    )
    return ClientConfig(**(base | kw))


def sweep_config(model_dir, result_dir, base_url, **kw):
    base = dict(
        base_url=base_url,
        model="tiny",
        tokenizer=model_dir,
        isl=32,
        osl=6,
        concurrency=[1, 2],
        num_prompts=4,
        result_dir=str(result_dir),
        prefill_gpus=1,
        decode_gpus=2,
        metadata={"recipe": "test"},
    )
    return ClientConfig(**(base | kw))
