"""`pdbench mock-engine`: a plain Typer-annotated function, registered by harness.cli.mock_engine."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from harness import exit_codes
from harness.mock_engine.settings import MockEngineConfig

DIST_HELP = "50 | constant:50 | normal:MEAN,STD | exponential:MEAN | uniform:LO,HI | lognormal:MEAN,STD"


def _fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=exit_codes.USAGE)


def mock_engine_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on.")] = 8000,
    model: Annotated[str, typer.Option("--model", help="Served model name (the one /v1/models lists).")] = "mock",
    ttft_ms: Annotated[str, typer.Option("--ttft-ms", help=f"Time to first token in ms: {DIST_HELP}.")] = "0",
    itl_ms: Annotated[str, typer.Option("--itl-ms", help=f"Inter-token latency in ms: {DIST_HELP}.")] = "0",
    role: Annotated[str, typer.Option("--role", help="prefill, decode or both (kv_transfer_params legs).")] = "both",
    eos_after: Annotated[
        int | None, typer.Option("--eos-after", help="Stop after N tokens unless ignore_eos [default: never]")
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len", help="Reject requests whose prompt + max_tokens exceed N tokens [default: no limit]"
        ),
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="Count tokens with this HF tokenizer [default: count words]")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the latency samples.")] = 0,
    engine_id: Annotated[
        str | None, typer.Option("--engine-id", help="remote_engine_id in kv_transfer_params [default: a random UUID]")
    ] = None,
    kv_host: Annotated[
        str | None,
        typer.Option(
            "--kv-host", help="remote_host advertised to decode [default: --host; 127.0.0.1 if that is 0.0.0.0]"
        ),
    ] = None,
    kv_port: Annotated[int, typer.Option("--kv-port", help="remote_port (TCP) advertised to decode.")] = 5600,
    max_num_seqs: Annotated[
        int | None,
        typer.Option("--max-num-seqs", help="Serve at most N requests at once; the rest queue [default: no limit]"),
    ] = None,
) -> None:
    """Run a mock OpenAI-compatible engine with injected latencies and vLLM's PD behaviour."""
    fields = dict(
        host=host,
        port=port,
        model=model,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        role=role,
        eos_after=eos_after,
        max_model_len=max_model_len,
        tokenizer=tokenizer,
        seed=seed,
        engine_id=engine_id,
        kv_host=kv_host,
        kv_port=kv_port,
        max_num_seqs=max_num_seqs,
    )
    try:
        config = MockEngineConfig(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        _fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    from harness.mock_engine.server import serve  # aiohttp: only for this command

    serve(config)
