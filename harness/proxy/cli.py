"""`pdbench proxy`: a plain Typer-annotated function, registered by harness.cli."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from harness.proxy.app import ProxyConfig, serve

SUPPORTED_CONNECTORS = ("nixl",)


def _fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=2)  # 2 = usage error, like Click's own


def proxy_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 30000,
    prefill: Annotated[
        list[str] | None,
        typer.Option(
            "--prefill", metavar="URL", help="Prefill base URL, e.g. http://10.0.0.1:8100 (repeatable)."
        ),
    ] = None,
    decode: Annotated[
        list[str] | None,
        typer.Option("--decode", metavar="URL", help="Decode server base URL (repeatable)."),
    ] = None,
    connector: Annotated[
        str, typer.Option("--connector", help="KV connector flow; only 'nixl' for now.")
    ] = "nixl",
    request_timeout_s: Annotated[
        float, typer.Option("--request-timeout-s", help="Total time allowed for one upstream leg.")
    ] = 600.0,
    stream_idle_timeout_s: Annotated[
        float, typer.Option("--stream-idle-timeout-s", help="Abort a decode stream silent for this long.")
    ] = 300.0,
    health_interval_s: Annotated[
        float, typer.Option("--health-interval-s", help="Seconds between backend /health polls.")
    ] = 2.0,
) -> None:
    """Run the minimal prefill/decode proxy (NIXL two-phase flow)."""
    if connector not in SUPPORTED_CONNECTORS:
        _fail(f"unsupported --connector {connector!r}; supported: {', '.join(SUPPORTED_CONNECTORS)}")
    if not prefill or not decode:
        _fail("at least one --prefill URL and one --decode URL are required")
    try:
        config = ProxyConfig(
            host=host,
            port=port,
            prefill=prefill,
            decode=decode,
            connector=connector,
            request_timeout_s=request_timeout_s,
            stream_idle_timeout_s=stream_idle_timeout_s,
            health_interval_s=health_interval_s,
        )
    except ValidationError as exc:
        _fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    serve(config)
