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
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="JSON file holding a BenchConfig; flags override it [default: none]")] = None,
    base_url: Annotated[Optional[str], typer.Option(
        help="Server URL, e.g. http://127.0.0.1:30000 (required, here or in --config).")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        help="API to call: completions or chat [default: completions]")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="Served model name sent in requests (required, here or in --config).")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="Tokenizer path or HF id (required, here or in --config).")] = None,
    isl: Annotated[Optional[int], typer.Option(help="Input length in tokens (required, here or in --config).")] = None,
    osl: Annotated[Optional[int], typer.Option(help="Output length in tokens (required, here or in --config).")] = None,
    range_ratio: Annotated[Optional[float], typer.Option(
        help="Length spread, a fraction: inferencex [r*len, len], vllm [(1-r)*len, (1+r)*len] [default: 1.0]")] = None,
    range_ratio_convention: Annotated[Optional[str], typer.Option(
        help="How --range-ratio applies: inferencex or vllm [default: inferencex]")] = None,
    concurrency: Annotated[Optional[str], typer.Option(
        help="Concurrency points, comma-separated, e.g. 1,2,4 (required, here or in --config).")] = None,
    request_rate: Annotated[Optional[str], typer.Option(
        help="Arrival rate in requests/s, or inf: all at once [default: inf]")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(
        help="Measured requests per point [default: max(--min-prompts, --prompts-multiplier x concurrency)]")] = None,
    prompts_multiplier: Annotated[Optional[int], typer.Option(
        help="Without --num-prompts: measured requests per point = this x concurrency [default: 10]")] = None,
    min_prompts: Annotated[Optional[int], typer.Option(
        help="Without --num-prompts: fewest measured requests per point [default: 16]")] = None,
    num_warmups: Annotated[Optional[int], typer.Option(
        help="Unmeasured warmup requests per point [default: 2 x concurrency]")] = None,
    cooldown_s: Annotated[Optional[float], typer.Option(
        help="Seconds to wait between concurrency points [default: 0 s]")] = None,
    request_timeout_s: Annotated[Optional[float], typer.Option(
        help="Seconds allowed for one request [default: 600 s]")] = None,
    point_timeout_s: Annotated[Optional[float], typer.Option(
        help="Seconds allowed for a point's warmups, and for its measured requests "
             "[default: derived from --request-timeout-s]")] = None,
    seed: Annotated[Optional[int], typer.Option(
        help="Random seed of the prompts and arrival gaps [default: 0]")] = None,
    ignore_eos: Annotated[Optional[bool], typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Ask for exactly --osl tokens, past EOS [default: --ignore-eos]")] = None,
    percentiles: Annotated[Optional[str], typer.Option(
        help="Latency percentiles to report, comma-separated [default: 90,99,99.9]")] = None,
    result_dir: Annotated[Optional[str], typer.Option(
        help="Directory the per-point result JSON files go to (required, here or in --config).")] = None,
    prefill_gpus: Annotated[Optional[int], typer.Option(
        help="Prefill GPUs, with --decode-gpus: file name and per-GPU figures [default: none, split unknown]")] = None,
    decode_gpus: Annotated[Optional[int], typer.Option(
        help="Decode GPUs, with --prefill-gpus [default: none, split unknown]")] = None,
    gpus: Annotated[Optional[int], typer.Option(
        help="GPUs of one aggregated server (no prefill/decode split): per-GPU figures for a baseline "
             "[default: none]")] = None,
    metadata: Annotated[Optional[str], typer.Option(help="JSON object copied into each result [default: {}]")] = None,
    dataset: Annotated[
        Optional[str],
        typer.Option("--dataset", "--dataset-name", help="Prompt source: random, jsonl or sharegpt [default: random]"),
    ] = None,
    dataset_path: Annotated[Optional[str], typer.Option(
        help="Prompt file for jsonl or sharegpt [default: none]")] = None,
    random_prefix_len: Annotated[
        Optional[int], typer.Option(help="Tokens of a random prefix shared by every prompt [default: 0]")
    ] = None,
    burstiness: Annotated[
        Optional[float], typer.Option(
            help="Gamma shape of arrival gaps at a finite rate: 1 Poisson, <1 burstier [default: 1.0]")
    ] = None,
    goodput: Annotated[
        Optional[list[str]],
        typer.Option(
            help="SLO in ms as KEY:VALUE (ttft, tpot, e2el); repeatable, or several in one value [default: none]"),
    ] = None,
    total_timeout_s: Annotated[
        Optional[float], typer.Option(
            help="Seconds bounding the whole sweep; partial results are kept [default: no bound]")
    ] = None,
    health_check_interval_s: Annotated[
        Optional[float], typer.Option(help="Seconds between <base-url>/health checks, 0: none [default: 2 s]")
    ] = None,
    server_pid: Annotated[
        Optional[list[int]],
        typer.Option("--server-pid", help="Server PID to watch; stop if it exits; repeatable [default: none]"),
    ] = None,
    progress: Annotated[Optional[str], typer.Option(
        help="Progress display: auto (rich on a terminal), rich or plain [default: auto]")] = None,
    scrape: Annotated[
        Optional[list[str]],
        typer.Option("--scrape", help="NAME=ROLE@URL of a server whose /metrics judge each point's validity; "
                     "repeatable [default: none, no verdict]"),
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
