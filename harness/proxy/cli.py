"""`pdbench proxy`: a plain Typer-annotated function, registered by harness.cli."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from harness.proxy.config import CONNECTORS, POLICIES, ProxyConfig
from harness.proxy.server import serve

SUPPORTED_CONNECTORS = CONNECTORS


def _fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=2)  # 2 = usage error, like Click's own


def proxy_command(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (one address; 0.0.0.0 means every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on.")] = 30000,
    prefill: Annotated[
        list[str] | None,
        typer.Option(
            "--prefill",
            metavar="URL",
            help="Prefill base URL, e.g. http://10.0.0.1:8100; repeatable "
            "(default: none; required unless --connector moriio).",
        ),
    ] = None,
    decode: Annotated[
        list[str] | None,
        typer.Option(
            "--decode",
            metavar="URL",
            help="Decode server base URL; repeatable (default: none; required unless --connector moriio).",
        ),
    ] = None,
    aggregated: Annotated[
        list[str] | None,
        typer.Option(
            "--aggregated",
            metavar="URL",
            help="With --connector none: a whole (aggregated) instance that serves each request alone, "
            "for a baseline; repeatable (default: none).",
        ),
    ] = None,
    connector: Annotated[
        str,
        typer.Option("--connector", help=f"KV connector flow: {', '.join(CONNECTORS)} (none: --aggregated instances)."),
    ] = "nixl",
    policy: Annotated[str, typer.Option("--policy", help=f"Instance choice: {', '.join(POLICIES)}.")] = "round_robin",
    expected_prefill: Annotated[
        int | None,
        typer.Option(
            "--expected-prefill", help="Prefill instances /health waits for (default: the number of --prefill URLs)."
        ),
    ] = None,
    expected_decode: Annotated[
        int | None,
        typer.Option(
            "--expected-decode", help="Decode instances /health waits for (default: the number of --decode URLs)."
        ),
    ] = None,
    prefill_dp_size: Annotated[
        int, typer.Option("--prefill-dp-size", help="DP ranks behind each static prefill URL.")
    ] = 1,
    decode_dp_size: Annotated[
        int, typer.Option("--decode-dp-size", help="DP ranks behind each static decode URL.")
    ] = 1,
    moriio_port: Annotated[
        int | None,
        typer.Option(
            "--moriio-port",
            help="MoRI-IO: ZMQ registration TCP port, proxy_ping_port "
            "(default: none; required for --connector moriio).",
        ),
    ] = None,
    moriio_host: Annotated[
        str,
        typer.Option(
            "--moriio-host",
            help="MoRI-IO: registration bind address; workers on other nodes must reach it "
            "(a job passes its node's address).",
        ),
    ] = "127.0.0.1",
    moriio_mode: Annotated[
        str | None, typer.Option("--moriio-mode", help="MoRI-IO: read or write (default: the first registration's).")
    ] = None,
    bootstrap_port: Annotated[
        list[int] | None,
        typer.Option(
            "--bootstrap-port",
            help="Mooncake: prefill bootstrap port (once for all, or once per --prefill; default 8998).",
        ),
    ] = None,
    request_timeout_s: Annotated[
        float, typer.Option("--request-timeout-s", help="Seconds allowed for one whole upstream leg.")
    ] = 600.0,
    stream_idle_timeout_s: Annotated[
        float, typer.Option("--stream-idle-timeout-s", help="Abort a decode stream silent for this many seconds.")
    ] = 300.0,
    health_interval_s: Annotated[
        float, typer.Option("--health-interval-s", help="Seconds between backend /health polls.")
    ] = 2.0,
    breaker_failures: Annotated[
        int, typer.Option("--breaker-failures", help="Failed legs in a row that take an instance out.")
    ] = 5,
    max_body_mb: Annotated[
        float, typer.Option("--max-body-mb", help="Largest accepted request body (MiB); larger ones get 413.")
    ] = 256.0,
    workers: Annotated[int, typer.Option("--workers", help="Server processes sharing the port (SO_REUSEPORT).")] = 1,
    overlap: Annotated[
        bool,
        typer.Option(
            "--overlap",
            help="pdbench connector: send each request's decode leg together with its prefill leg "
            "(once the prefill instance's KV endpoint is known from its first answer); decode's pull "
            "waits at prefill until the KV is there (default: off, two-phase).",
        ),
    ] = False,
    timings_dir: Annotated[
        str | None,
        typer.Option(
            "--timings-dir",
            help="Write each request's timings (those with an X-Pdbench-Id header, which `pdbench bench` "
            "sends) to DIR/proxy-timings-<pid>.jsonl, for the TTFT breakdown (default: none).",
        ),
    ] = None,
) -> None:
    """Run the prefill/decode proxy (NIXL, pdbench, MoRI-IO and Mooncake flows)."""
    if connector not in CONNECTORS:
        _fail(f"unsupported --connector {connector!r}; supported: {', '.join(CONNECTORS)}")
    if policy not in POLICIES:
        _fail(f"unsupported --policy {policy!r}; supported: {', '.join(POLICIES)}")
    if moriio_mode is not None and moriio_mode not in ("read", "write"):
        _fail(f"--moriio-mode must be read or write, not {moriio_mode!r}")
    if connector == "none" and not aggregated:
        _fail("--connector none needs at least one --aggregated URL")
    if connector not in ("moriio", "none") and (not prefill or not decode):
        _fail("at least one --prefill URL and one --decode URL are required")
    try:
        config = ProxyConfig(
            host=host,
            port=port,
            prefill=prefill or [],
            decode=decode or [],
            aggregated=aggregated or [],
            connector=connector,
            policy=policy,
            expected_prefill=expected_prefill,
            expected_decode=expected_decode,
            prefill_dp_size=prefill_dp_size,
            decode_dp_size=decode_dp_size,
            moriio_port=moriio_port,
            moriio_host=moriio_host,
            moriio_mode=moriio_mode,
            bootstrap_ports=bootstrap_port or [],
            request_timeout_s=request_timeout_s,
            stream_idle_timeout_s=stream_idle_timeout_s,
            health_interval_s=health_interval_s,
            breaker_failures=breaker_failures,
            max_body_bytes=int(max_body_mb * 1024 * 1024),
            workers=workers,
            overlap=overlap,
            timings_dir=timings_dir,
        )
    except ValidationError as exc:
        _fail("; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()))
    serve(config)
