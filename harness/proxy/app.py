"""The prefill/decode (PD) proxy's request handling: upstream legs and metrics.

The process around it (routes, loop, workers) is `server`; the HTTP/1.1 server it
runs on is `http`; error answers `errors`.

Per request: validate the body, pick a prefill and a decode instance (policy, DP rank),
shape both legs for the connector (`flows`), run them (one after the other, or at
once) over a lean keep-alive HTTP client (`upstream`), and relay decode's bytes to the
client untouched. Instances come from the command line and, for MoRI-IO, from
registrations (`registry`). The poller of `health` checks every instance's /health;
a circuit breaker takes out instances whose legs keep failing until a health check
passes again.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from yarl import URL

from harness.proxy.backends import Backend, Pool, Role, hash64
from harness.proxy.config import ProxyConfig
from harness.proxy.errors import UpstreamError, describe, error_response
from harness.proxy.flows import (
    BadRequest,
    Flow,
    affinity_key,
    dumps,
    loads,
    make_flow,
    parse_request,
    random_id,
)
from harness.proxy.health import HealthPoller, read_capped, readiness
from harness.proxy.http import HttpConnection, Reply, Request, Stream
from harness.proxy.prometheus import ProxyMetrics
from harness.proxy.registry import Registry
from harness.proxy.shared import SharedState
from harness.proxy.upstream import LOCAL, Response, UpstreamClient, UpstreamFailure
from harness.rundir.proxy_timings import HEADER as TIMING_HEADER
from harness.rundir.proxy_timings import Stamps, TimingLog
from harness.rundir.session_header import SESSION_HEADER

log = logging.getLogger(__name__)

# Connecting must not eat the whole leg budget when a host is black-holed.
MAX_CONNECT_S = 30.0
# /v1/models is metadata: no reason to wait as long as for a generation.
MAX_MODELS_S = 30.0
# A prefill answer is one token (plus logprobs at most); a decode error body is short.
MAX_PREFILL_RESPONSE = 64 * 1024 * 1024
MAX_ERROR_BODY = 64 * 1024
# Request headers are keyed by lower-case name (harness.proxy.http).
TIMING_KEY = TIMING_HEADER.lower()
SESSION_KEY = SESSION_HEADER.lower()


def _auth_headers(request: Request) -> dict[str, str]:
    auth = request.headers.get("authorization")
    return {"Authorization": auth} if auth else {}


class Proxy:
    """State shared by the handlers of one app: session, pool, flow, metrics."""

    def __init__(self, config: ProxyConfig, shared: SharedState | None = None) -> None:
        self.cfg = config
        # No KV connector: each request goes whole to one aggregated instance.
        self.aggregated = config.use.instances == "aggregated"
        self.pool = Pool(config)
        self.metrics = ProxyMetrics(self.pool)
        self.flow: Flow = make_flow(config.connector, config.moriio_mode, config.overlap)
        self.session: aiohttp.ClientSession | None = None
        self.background: set[asyncio.Task[Any]] = set()
        self.registry: Registry | None = None
        self.registration_endpoint: str | None = None
        for i, url in enumerate(config.prefill):
            b = self.pool.add(Backend("prefill", url, dp_size=config.prefill_dp_size))
            if config.use.bootstrap_port is not None:
                host = f"[{b.host}]" if ":" in b.host else b.host
                b.bootstrap_addr = f"http://{host}:{config.bootstrap_port(i)}"
        for url in config.decode:
            self.pool.add(Backend("decode", url, dp_size=config.decode_dp_size))
        for url in config.aggregated:
            self.pool.add(Backend("aggregated", url))
        if shared is not None:  # --workers: one view of legs in flight and circuits
            self.pool.share(shared)
        if config.use.instances == "registered":
            self.registry = Registry(
                self.pool,
                config.moriio_mode,
                self._set_mode,
                lambda result: self.metrics.registrations.labels(result).inc(),
            )
        connect = min(MAX_CONNECT_S, config.request_timeout_s)
        self.leg_timeout = aiohttp.ClientTimeout(total=config.request_timeout_s, sock_connect=connect)
        self.health = HealthPoller(config, self.pool, self.registry, lambda: self.http)
        self.upstream = UpstreamClient(connect)
        self._urls: dict[tuple[str, str], URL] = {}
        self.timings = TimingLog(config.timings_dir) if config.timings_dir else None

    def _set_mode(self, mode: str) -> None:
        self.flow = make_flow(self.cfg.connector, mode)

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self.session is not None, "proxy app not started"
        return self.session

    def _url(self, b: Backend, path: str) -> URL:
        # Building yarl URLs is not free; the set of (backend, path) pairs is small.
        key = (b.url, path)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            url = self._urls[key] = URL(b.url + path)
        return url

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    # -- lifecycle ---------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        # Health checks, bootstrap queries and /v1/models (the legs use self.upstream).
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=self.leg_timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        tasks = [asyncio.ensure_future(self.health.run())]
        if self.registry is not None:
            bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            tasks.append(
                asyncio.ensure_future(self.registry.serve(self.cfg.moriio_host, self.cfg.moriio_port or 0, bound))
            )
            try:
                self.registration_endpoint = await asyncio.wait_for(bound, 10)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self.session.close()
                raise
        # Everything allocated so far lives as long as the process: keep the garbage
        # collector from scanning it again and again under load.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            for t in [*tasks, *self.background]:
                t.cancel()
            await asyncio.gather(*tasks, *self.background, return_exceptions=True)
            self.upstream.close()
            await self.session.close()
            self.session = None
            if self.timings is not None:
                self.timings.close()

    # -- handlers ----------------------------------------------------------

    def health_state(self) -> tuple[bool, dict[str, Any]]:
        return readiness(self.cfg, self.pool, self.registry)

    async def handle_health(self, request: Request, conn: HttpConnection) -> Reply:
        ok, body = self.health_state()
        return Reply(dumps(body), 200 if ok else 503)

    async def handle_metrics(self, request: Request, conn: HttpConnection) -> Reply:
        return Reply(self.metrics.render(time.monotonic()), content_type=self.metrics.content_type)

    async def handle_models(self, request: Request, conn: HttpConnection) -> Reply:
        now = time.monotonic()
        role: Role = "aggregated" if self.aggregated else "decode"
        decodes = self.pool.available(role, now) or self.pool.backends[role]
        if not decodes:
            return error_response(503, "no decode instance is known yet", "no_backend")
        url = self._url(decodes[0], "/v1/models")
        timeout = aiohttp.ClientTimeout(total=min(MAX_MODELS_S, self.cfg.request_timeout_s))
        try:
            async with self.http.get(url, headers=_auth_headers(request), timeout=timeout) as resp:
                raw = await read_capped(resp, MAX_PREFILL_RESPONSE)
                ctype = resp.headers.get("Content-Type", "application/json")
                return Reply(raw, resp.status, ctype)
        except (asyncio.TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("decode %s /v1/models failed: %s", decodes[0].url, describe(exc))
            return error_response(502, f"decode /v1/models failed: {describe(exc)}", "connection_error", decodes[0].url)

    async def handle_generate(self, request: Request, conn: HttpConnection) -> Reply | Stream:
        m = self.metrics
        m.in_flight.inc()
        status = 500
        tag = request.headers.get(TIMING_KEY) if self.timings is not None else None
        stamps = Stamps(tag) if tag else None
        try:
            resp = await self._generate(request, conn, stamps)
            status = resp.status
            return resp
        except asyncio.CancelledError:
            status = 499  # client closed the connection (nginx's convention)
            m.errors.labels("client_disconnect").inc()
            raise
        except Exception:  # the proxy never dies from a request
            log.exception("unexpected error serving %s", request.path)
            m.errors.labels("internal").inc()
            return error_response(500, "internal proxy error (see the proxy log)", "internal_error")
        finally:
            m.in_flight.dec()
            m.request_done(request.path, status)
            if stamps is not None and self.timings is not None:
                self.timings.write(stamps)

    def _reject(
        self, status: int, message: str, kind: str, backend: str | None = None, rid: str | None = None
    ) -> Reply:
        self.metrics.errors.labels(kind).inc()
        return error_response(status, message, kind, backend, rid)

    async def _generate(self, request: Request, conn: HttpConnection, stamps: Stamps | None = None) -> Reply | Stream:
        cfg = self.cfg
        if request.too_large:  # read and dropped by the server; the connection closes after this answer
            length = request.content_length
            size = f"of {length} bytes " if length is not None else ""
            return self._reject(413, f"request body {size}exceeds {cfg.max_body_bytes} bytes", "request_too_large")
        try:
            body = parse_request(request.body, request.path.endswith("/chat/completions"))
        except BadRequest as exc:
            return self._reject(400, str(exc), "invalid_request_error")

        key = self._routing_key(request, body)
        now = time.monotonic()
        if self.aggregated:
            return await self._forward(request, conn, body, key, now, stamps)
        picked_p = self.pool.pick("prefill", key, now)
        picked_d = self.pool.pick("decode", key, now) if picked_p else None
        if picked_p is None or picked_d is None:
            role: Role = "prefill" if picked_p is None else "decode"
            known = [b.url for b in self.pool.backends[role]]
            return self._reject(
                503,
                f"no {role} instance available (known: {known or 'none'}; see /health)",
                "no_backend",
                ",".join(known) or None,
            )
        p, rank = picked_p
        d = picked_d[0]
        flow = self.flow
        rid = flow.request_id(p, d)
        tid = flow.transfer_id(rid)
        headers = {"Content-Type": "application/json", "X-Request-Id": rid, **_auth_headers(request)}
        p_headers = {**headers, **flow.prefill_headers(p, rank)}
        p_data = dumps(flow.prefill(body, p, rank, d, tid))
        p.outstanding += 1
        d.outstanding += 1
        tag = stamps.id if stamps is not None else None  # the client's X-Pdbench-Id, for decode's connector

        if stamps is not None:
            stamps.prefill_sent = time.perf_counter()
        if not flow.concurrent_with(p):
            try:
                kv = await self._prefill(p, request.path, p_data, p_headers)
                if stamps is not None:
                    stamps.prefill_done = time.perf_counter()
            except UpstreamError as err:
                d.outstanding -= 1
                log.warning("prefill %s failed (request %s): %s", err.backend, rid, err.message)
                self.metrics.errors.labels("prefill_" + err.category).inc()
                return err.response(rid)
            except BaseException:
                d.outstanding -= 1
                raise
            if flow.missing_kv(kv):
                self.metrics.kv_missing.inc()
                log.warning(
                    "prefill %s returned no usable kv_transfer_params (request %s): decode recomputes the prompt",
                    p.url,
                    rid,
                )
            d_body = flow.tag_decode(flow.decode(body, p, rank, d, tid, kv), tag)
            return await self._decode(request, conn, d, d_body, headers, rid, None, stamps)

        d_body = flow.tag_decode(flow.decode(body, p, rank, d, tid, None), tag)
        prefill = self._spawn(self._prefill(p, request.path, p_data, p_headers), "prefill")
        prefill.add_done_callback(lambda t: self._prefill_done(t, rid, stamps))
        return await self._decode(request, conn, d, d_body, headers, rid, prefill, stamps)

    def _routing_key(self, request: Request, body: dict[str, Any]) -> int | None:
        """What keeps requests together (policies prefix_hash and session); None: no affinity."""
        policy = self.cfg.policy
        if policy == "session" and (session := request.headers.get(SESSION_KEY)):
            return hash64(session.encode("utf-8", "surrogatepass"))
        if policy in ("prefix_hash", "session"):
            # Without a session id a conversation still shares its first turn's prefix.
            return affinity_key(body, self.cfg.prefix_chars)
        return None

    async def _forward(
        self,
        request: Request,
        conn: HttpConnection,
        body: dict[str, Any],
        key: int | None,
        now: float,
        stamps: Stamps | None,
    ) -> Reply | Stream:
        """The aggregated baseline: the whole request to one instance, relayed like a decode leg."""
        picked = self.pool.pick("aggregated", key, now)
        if picked is None:
            known = [b.url for b in self.pool.backends["aggregated"]]
            return self._reject(
                503,
                f"no aggregated instance available (known: {known or 'none'}; see /health)",
                "no_backend",
                ",".join(known) or None,
            )
        a = picked[0]
        rid = f"agg-{random_id()}"
        headers = {"Content-Type": "application/json", "X-Request-Id": rid, **_auth_headers(request)}
        a.outstanding += 1
        return await self._decode(request, conn, a, body, headers, rid, None, stamps)

    def _prefill_done(self, task: asyncio.Task[Any], rid: str, stamps: Stamps | None = None) -> None:
        """A concurrent prefill ended: retrieve (and report) its failure."""
        if stamps is not None:
            stamps.prefill_done = time.perf_counter()
        if task.cancelled():
            return
        err = task.exception()
        if isinstance(err, UpstreamError):
            log.warning("prefill %s failed (request %s): %s", err.backend, rid, err.message)
            self.metrics.errors.labels("prefill_" + err.category).inc()
        elif err is not None:
            log.error("prefill leg crashed (request %s): %s", rid, describe(err))

    async def _prefill(self, p: Backend, path: str, data: bytes, headers: dict[str, str]) -> Any:
        """Run the prefill leg; returns its kv_transfer_params (None if absent)."""
        seconds, failures = self.metrics.attach(p)
        start = time.perf_counter()
        try:
            try:
                resp = await self.upstream.post(
                    p.host, p.port, path, data, headers, self.cfg.request_timeout_s, None, p.ssl
                )
                try:
                    status = resp.status
                    raw = await resp.read(MAX_PREFILL_RESPONSE if status < 300 else MAX_ERROR_BODY)
                finally:
                    resp.close()
            except UpstreamFailure as exc:
                if exc.kind == "timeout":
                    msg = f"prefill timed out after {self.cfg.request_timeout_s:g}s"
                else:
                    msg = f"prefill failed: {exc}"
                raise UpstreamError(p.url, 503 if exc.kind == LOCAL else 502, exc.kind, msg) from None
            if not 200 <= status < 300:
                raise UpstreamError.from_status(p.url, "prefill", status, raw)
            try:
                data_out = loads(raw)
            except Exception:
                raise UpstreamError(p.url, 502, "invalid_upstream_response", "prefill returned non-JSON") from None
        except UpstreamError as err:
            if err.backend_fault:
                failures.inc()
                self.pool.record_failure(p, err.message)
            raise
        finally:
            p.outstanding -= 1
        seconds.observe(time.perf_counter() - start)
        self.pool.record_success(p)
        kv = data_out.get("kv_transfer_params") if isinstance(data_out, dict) else None
        self.flow.prefill_answered(p, kv)
        return kv

    async def _start_decode(
        self,
        d: Backend,
        path: str,
        data: bytes,
        headers: dict[str, str],
        idle: float | None,
        prefill: asyncio.Task[Any] | None,
    ) -> Response:
        """Send the decode leg; with a concurrent prefill, fail fast if the prefill fails first."""
        coro = self.upstream.post(d.host, d.port, path, data, headers, self.cfg.request_timeout_s, idle, d.ssl)
        if prefill is None:
            return await coro
        start = asyncio.ensure_future(coro)
        try:
            await asyncio.wait((start, prefill), return_when=asyncio.FIRST_COMPLETED)
            failed = self._prefill_error(prefill)
            if failed is not None:
                raise failed
            return await start
        except BaseException:
            if not start.done():
                start.cancel()
                await asyncio.gather(start, return_exceptions=True)
            elif not start.cancelled() and start.exception() is None:
                start.result().close()
            raise

    async def _decode(
        self,
        request: Request,
        conn: HttpConnection,
        d: Backend,
        body: dict[str, Any],
        headers: dict[str, str],
        rid: str,
        prefill: asyncio.Task[Any] | None,
        stamps: Stamps | None = None,
    ) -> Reply | Stream:
        """Run the decode leg, relaying its bytes to the client as they arrive."""
        seconds, failures = self.metrics.attach(d)
        start = time.perf_counter()
        if stamps is not None:
            stamps.decode_sent = start
        stream = bool(body.get("stream"))
        up: Response | None = None
        try:
            try:
                up = await self._start_decode(
                    d, request.path, dumps(body), headers, self.cfg.stream_idle_timeout_s if stream else None, prefill
                )
            except UpstreamError as err:  # the concurrent prefill failed first (counted by _prefill_done)
                return err.response(rid)
            except UpstreamFailure as exc:
                if exc.kind == LOCAL:  # the proxy's own shortage: decode is not at fault, nor taken out
                    log.warning("decode %s not reached (request %s): %s", d.url, rid, exc)
                    return self._reject(503, f"decode not reached: {exc}", LOCAL, d.url, rid)
                msg = (
                    f"decode timed out after {self.cfg.request_timeout_s:g}s"
                    if exc.kind == "timeout"
                    else f"decode failed: {exc}"
                )
                return self._decode_failed(d, failures, rid, exc.kind, msg)

            if not 200 <= up.status < 300:
                try:
                    raw = await up.read(MAX_ERROR_BODY)
                except UpstreamFailure:
                    raw = b""
                status_err = UpstreamError.from_status(d.url, "decode", up.status, raw)
                if status_err.backend_fault:
                    failures.inc()
                    self.pool.record_failure(d, status_err.message)
                log.warning("decode %s failed (request %s): %s", d.url, rid, status_err.message)
                self.metrics.errors.labels("decode_" + status_err.category).inc()
                return status_err.response(rid)

            out_headers = {"Content-Type": up.content_type, "X-Request-Id": rid}
            try:
                first = await (up.read(MAX_PREFILL_RESPONSE) if not stream else up.read_chunk())
                if stamps is not None:
                    stamps.decode_first = time.perf_counter()
            except UpstreamFailure as exc:
                kind, msg, url = self._stream_failure(exc, prefill, d)
                if url != d.url:
                    return error_response(502, msg, kind, url, rid)
                return self._decode_failed(d, failures, rid, exc.kind, f"decode failed mid-response: {msg}")
            if up.at_eof and self._prefill_error(prefill) is None:
                # The whole answer is here (a non-streamed or short response): one write.
                self._leg_ok(d, seconds, start)
                return Reply(first, up.status, up.content_type, out_headers)

            # With a known length, no chunked framing to add.
            resp = conn.stream(request, up.status, up.content_type, out_headers, up.content_length)
            if prefill is not None and not prefill.done():
                # WRITE-style flows: decode waits for KV that a failed prefill never sends.
                # Stop relaying at once instead of waiting for the idle timeout.
                upstream = up
                prefill.add_done_callback(
                    lambda t: upstream.close() if not t.cancelled() and t.exception() is not None else None
                )
            try:
                chunk = first
                while True:
                    if up.at_eof:  # the last piece: it leaves with the end of the body
                        failed = self._prefill_error(prefill)
                        if failed is not None:
                            if chunk:
                                await resp.write(chunk)
                            return await self._abort(
                                resp, failed.backend, rid, "prefill_" + failed.category, failed.message
                            )
                        resp.end(chunk)
                        self._leg_ok(d, seconds, start)
                        return resp
                    if chunk:
                        await resp.write(chunk)
                    try:
                        chunk = await up.read_chunk()
                    except UpstreamFailure as exc:
                        kind, msg, url = self._stream_failure(exc, prefill, d)
                        if url == d.url:
                            failures.inc()
                            self.pool.record_failure(d, msg)
                        return await self._abort(resp, url, rid, kind, msg)
            except ConnectionError:
                # Client went away mid-response (without handler cancellation).
                self.metrics.errors.labels("client_disconnect").inc()
                log.info("client disconnected (request %s)", rid)
                return resp
        finally:
            d.outstanding -= 1
            finished = up is not None and up.at_eof
            if up is not None:
                # Closing an unfinished response drops the upstream connection, which
                # makes vLLM abort the request and free its KV.
                up.close()
            if prefill is not None and not prefill.done() and not finished:
                prefill.cancel()  # the client is gone or decode failed: free the prefill too

    def _leg_ok(self, d: Backend, seconds: Any, start: float) -> None:
        seconds.observe(time.perf_counter() - start)
        self.pool.record_success(d)

    def _decode_failed(self, d: Backend, failures: Any, rid: str, kind: str, msg: str) -> Reply:
        failures.inc()
        self.pool.record_failure(d, msg)
        log.warning("decode %s failed (request %s): %s", d.url, rid, msg)
        return self._reject(502, msg, "decode_" + kind, d.url, rid)

    @staticmethod
    def _prefill_error(prefill: asyncio.Task[Any] | None) -> UpstreamError | None:
        if prefill is None or not prefill.done() or prefill.cancelled():
            return None
        err = prefill.exception()
        return err if isinstance(err, UpstreamError) else None

    def _stream_failure(
        self, exc: UpstreamFailure, prefill: asyncio.Task[Any] | None, d: Backend
    ) -> tuple[str, str, str]:
        """(type, message, backend) of an error while relaying the decode body."""
        failed = self._prefill_error(prefill)
        if failed is not None:  # we closed the decode stream because the prefill failed
            return "prefill_" + failed.category, failed.message, failed.backend
        if exc.kind == "stream_idle_timeout":
            return exc.kind, f"decode sent nothing for {self.cfg.stream_idle_timeout_s:g}s", d.url
        if exc.kind == "timeout":
            return exc.kind, f"decode exceeded {self.cfg.request_timeout_s:g}s", d.url
        return exc.kind, describe(exc), d.url

    async def _abort(self, resp: Stream, url: str, rid: str, kind: str, msg: str) -> Stream:
        """End a response already under way: headers are sent, so no error status is possible."""
        log.warning("response from %s aborted (request %s): %s", url, rid, msg)
        if not kind.startswith("prefill_"):  # prefill failures are counted by _prefill_done
            self.metrics.errors.labels("decode_" + kind).inc()
        if resp.content_type == "text/event-stream":
            event = {"error": {"message": msg, "type": kind, "backend": url, "code": 502}}
            try:
                await resp.write(b"data: " + dumps(event) + b"\n\n")
            except ConnectionError:
                pass
        # Closing the socket without the final chunk makes the client see a
        # truncated (failed) response rather than a clean end.
        resp.abort()
        return resp
