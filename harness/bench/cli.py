"""`pdbench bench`: run a benchmark sweep from a JSON BenchConfig and/or flags.

Exit codes: 0 every point written and no request failed; 1 a request failed, a point
could not be run, the target died or the total timeout hit (the results of the points
that ran are still written, a cut-short one with its `stop_reason`); 2 the
configuration is invalid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from harness.bench.config import BenchConfig


def _csv(value: str | None) -> list[str] | None:
    # Items stay strings: pydantic coerces them and names the bad one on error.
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _goodput(values: list[str]) -> dict[str, str]:
    """["ttft:500 tpot:50", "e2el:2000"] -> {"ttft": "500", ...}; BenchConfig checks names and numbers."""
    slos: dict[str, str] = {}
    for item in " ".join(values).replace(",", " ").split():
        name, sep, value = item.partition(":")
        if not sep or not name or not value:
            raise _fail(f"invalid benchmark config:\n  goodput: expected KEY:VALUE in ms, got {item!r}", 2)
        slos[name.strip()] = value.strip()
    return slos


def _fail(msg: str, code: int) -> typer.Exit:
    typer.echo(f"pdbench bench: {msg}", err=True)
    return typer.Exit(code)


def load_config(config: Path | None, overrides: dict[str, Any]) -> BenchConfig:
    """Merge the JSON file (if any) with the flags given; raise typer.Exit(2) if invalid."""
    data: dict[str, Any] = {}
    if config is not None:
        try:
            data = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise _fail(f"cannot read config {config}: {e}", 2) from None
        if not isinstance(data, dict):
            raise _fail(f"config {config} must hold a JSON object", 2)
    data |= {k: v for k, v in overrides.items() if v is not None}
    try:
        return BenchConfig.model_validate(data)
    except ValidationError as e:
        lines = [
            f"  {'.'.join(str(x) for x in err['loc']) or '(config)'}: {err['msg']}" for err in e.errors()
        ]
        raise _fail("invalid benchmark config:\n" + "\n".join(lines), 2) from None


def bench_command(
    config: Annotated[Optional[Path], typer.Option("--config", help="JSON file holding a BenchConfig.")] = None,
    base_url: Annotated[Optional[str], typer.Option(help="Server URL, e.g. http://127.0.0.1:30000.")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="completions or chat.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Served model name sent in requests.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer path or id.")] = None,
    isl: Annotated[Optional[int], typer.Option(help="Input length in tokens.")] = None,
    osl: Annotated[Optional[int], typer.Option(help="Output length in tokens.")] = None,
    range_ratio: Annotated[Optional[float], typer.Option()] = None,
    range_ratio_convention: Annotated[Optional[str], typer.Option(help="inferencex or vllm.")] = None,
    concurrency: Annotated[Optional[str], typer.Option(help="Comma-separated, e.g. 1,2,4.")] = None,
    request_rate: Annotated[Optional[str], typer.Option(help="Requests/s, or inf.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Measured requests per point.")] = None,
    prompts_multiplier: Annotated[Optional[int], typer.Option()] = None,
    min_prompts: Annotated[Optional[int], typer.Option()] = None,
    num_warmups: Annotated[Optional[int], typer.Option(help="Default 2 x concurrency.")] = None,
    cooldown_s: Annotated[Optional[float], typer.Option()] = None,
    request_timeout_s: Annotated[Optional[float], typer.Option()] = None,
    point_timeout_s: Annotated[Optional[float], typer.Option()] = None,
    seed: Annotated[Optional[int], typer.Option()] = None,
    ignore_eos: Annotated[Optional[bool], typer.Option("--ignore-eos/--no-ignore-eos")] = None,
    percentiles: Annotated[Optional[str], typer.Option(help="Comma-separated, e.g. 90,99,99.9.")] = None,
    result_dir: Annotated[Optional[str], typer.Option()] = None,
    prefill_gpus: Annotated[Optional[int], typer.Option()] = None,
    decode_gpus: Annotated[Optional[int], typer.Option()] = None,
    metadata: Annotated[Optional[str], typer.Option(help="JSON object copied into each result.")] = None,
    dataset: Annotated[
        Optional[str], typer.Option("--dataset", "--dataset-name", help="random, jsonl or sharegpt.")
    ] = None,
    dataset_path: Annotated[Optional[str], typer.Option(help="Prompt file for jsonl or sharegpt.")] = None,
    random_prefix_len: Annotated[
        Optional[int], typer.Option(help="Tokens of a random prefix shared by every prompt.")
    ] = None,
    burstiness: Annotated[
        Optional[float], typer.Option(help="Gamma shape of arrival gaps at a finite rate: 1 Poisson, <1 burstier.")
    ] = None,
    goodput: Annotated[
        Optional[list[str]],
        typer.Option(help="SLO in ms as KEY:VALUE (ttft, tpot, e2el); repeatable, or several in one value."),
    ] = None,
    total_timeout_s: Annotated[
        Optional[float], typer.Option(help="Bound on the whole sweep; partial results are kept.")
    ] = None,
    health_check_interval_s: Annotated[
        Optional[float], typer.Option(help="Seconds between <base-url>/health checks (0: none).")
    ] = None,
    server_pid: Annotated[
        Optional[list[int]], typer.Option("--server-pid", help="Server PID to watch; stop if it exits. Repeatable.")
    ] = None,
    progress: Annotated[Optional[str], typer.Option(help="auto, rich or plain.")] = None,
    scrape: Annotated[
        Optional[list[str]],
        typer.Option("--scrape", help="NAME=ROLE@URL of a server whose /metrics judge each point's validity. Repeatable."),
    ] = None,
) -> None:
    """Benchmark a running OpenAI-compatible server over a concurrency sweep."""
    overrides = dict(locals())  # every flag, keyed by its BenchConfig field name
    del overrides["config"]
    overrides["concurrency"] = _csv(concurrency)
    overrides["percentiles"] = _csv(percentiles)
    overrides["server_pids"] = overrides.pop("server_pid") or None
    overrides["scrape"] = scrape or None
    if goodput:
        overrides["goodput"] = _goodput(goodput)
    if metadata is not None:
        try:
            overrides["metadata"] = json.loads(metadata)
        except json.JSONDecodeError as e:
            raise _fail(f"invalid benchmark config:\n  metadata: not JSON: {e}", 2) from None
    cfg = load_config(config, overrides)

    from harness.bench.sweep import run_sweep_detailed  # heavy imports only when running

    try:
        outcomes = run_sweep_detailed(cfg)
    except Exception as e:  # noqa: BLE001 - e.g. results already exist, tokenizer not found
        raise _fail(f"{type(e).__name__}: {e}", 1) from None
    if not all(o.ok for o in outcomes):
        bad = [f"C={o.concurrency} ({o.error or f'{o.failed} failed'})" for o in outcomes if not o.ok]
        raise _fail("not every request succeeded: " + "; ".join(bad), 1)
