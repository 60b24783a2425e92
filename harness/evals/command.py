"""The lm-eval command line of one task against one endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.config.accuracy import AccuracyTask

ENDPOINTS = {"local-completions": "/v1/completions", "local-chat-completions": "/v1/chat/completions"}


@dataclass(frozen=True)
class Endpoint:
    """Where and what lm-eval asks: the proxy's base URL (http://host:port), the served name."""

    base: str
    model: str
    model_type: str
    tokenizer: str
    max_length: int

    @property
    def url(self) -> str:
        return self.base.rstrip("/") + ENDPOINTS[self.model_type]


def _model_args(ep: Endpoint, concurrency: int, request_timeout_s: float) -> str:
    # lm-eval splits model_args on ',' and '=': values must carry neither.
    args = {
        "model": ep.model,
        "base_url": ep.url,
        "num_concurrent": str(concurrency),
        "max_retries": "3",
        "timeout": str(int(request_timeout_s)),
        "tokenized_requests": "False",
        "max_length": str(ep.max_length),
    }
    if ep.model_type == "local-completions":
        # A local tokenizer (offline), never the auto-detection's probe of the server.
        args |= {"tokenizer_backend": "huggingface", "tokenizer": ep.tokenizer}
    bad = [f"{k}={v}" for k, v in args.items() if "," in v or "=" in v]
    if bad:
        raise ValueError(f"lm-eval model_args cannot carry ',' or '=' in a value: {', '.join(bad)}")
    return ",".join(f"{k}={v}" for k, v in args.items())


def lm_eval_argv(
    python: str,
    task: AccuracyTask,
    ep: Endpoint,
    concurrency: int,
    output: Path,
    include_path: Path | None,
    request_timeout_s: float,
) -> list[str]:
    """`<python> -m lm_eval run ...` (accuracy.python): greedy, samples logged, results under `output`."""
    argv = [python, "-m", "lm_eval", "run", "--model", ep.model_type, "--tasks", task.name]
    argv += ["--model_args", _model_args(ep, concurrency, request_timeout_s)]
    argv += ["--gen_kwargs", "temperature=0", "--output_path", str(output), "--log_samples", "--seed", "0"]
    if ep.model_type == "local-chat-completions":
        argv.append("--apply_chat_template")
    if include_path is not None:
        argv += ["--include_path", str(include_path)]
    if task.num_fewshot is not None:
        argv += ["--num_fewshot", str(task.num_fewshot)]
    if task.limit is not None:
        argv += ["--limit", str(task.limit)]
    return argv
