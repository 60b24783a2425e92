"""Minimal prefill/decode (PD) proxy for NIXL-disaggregated vLLM.

Per request (the flow of vLLM's toy_proxy_server): a prefill leg with
``max_tokens=1`` and ``do_remote_decode``, then a decode leg carrying the
prefill's ``kv_transfer_params``, whose response is streamed to the client.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

log = logging.getLogger(__name__)

# Long-context prompts easily exceed aiohttp's 1 MiB default request limit.
MAX_REQUEST_BYTES = 256 * 1024 * 1024
# Connecting must not eat the whole leg budget when a host is black-holed.
MAX_CONNECT_S = 30.0
# /v1/models is metadata: no reason to wait as long as for a generation.
MAX_MODELS_S = 30.0

Role = Literal["prefill", "decode"]

# What the prefill leg asks for: keep the KV blocks for a remote decoder.
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class ProxyConfig(BaseModel):
    """Settings of one proxy process (mirrors the `pdbench proxy` options)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(30000, ge=0, le=65535)
    prefill: list[str] = Field(min_length=1, description="prefill base URLs")
    decode: list[str] = Field(min_length=1, description="decode base URLs")
    connector: Literal["nixl"] = "nixl"
    request_timeout_s: float = Field(600.0, gt=0, description="total time for one upstream leg")
    stream_idle_timeout_s: float = Field(300.0, gt=0, description="abort a silent decode stream")
    health_interval_s: float = Field(2.0, gt=0)
    health_timeout_s: float = Field(2.0, gt=0, description="timeout of one backend /health poll")

    @field_validator("prefill", "decode")
    @classmethod
    def _normalize_urls(cls, urls: list[str]) -> list[str]:
        out = []
        for url in urls:
            url = url.strip().rstrip("/")
            if not url:
                raise ValueError("empty backend URL")
            # Accept bare host:port, as launch scripts often pass that.
            out.append(url if "://" in url else f"http://{url}")
        for url in out:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"backend URL must be http(s): {url}")
        return out


class UpstreamError(Exception):
    """A failed upstream leg, rendered as a JSON error naming the backend."""

    def __init__(self, backend: str, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.backend, self.status, self.kind, self.message = backend, status, kind, message

    @classmethod
    def from_status(cls, backend: str, leg: str, status: int, raw: bytes) -> UpstreamError:
        msg, kind = _backend_message(raw)
        # A 4xx is the backend rejecting the request: the client should see it
        # as such. Anything else is the backend failing: a gateway error.
        out = status if 400 <= status < 500 else 502
        return cls(backend, out, kind or "upstream_error", f"{leg} returned HTTP {status}: {msg}")

    def response(self, request_id: str | None = None) -> web.Response:
        return error_response(self.status, self.message, self.kind, self.backend, request_id)


def error_response(
    status: int, message: str, kind: str, backend: str | None = None, request_id: str | None = None
) -> web.Response:
    headers = {"X-Request-Id": request_id} if request_id else None
    body = {"error": {"message": message, "backend": backend, "type": kind}}
    return web.json_response(body, status=status, headers=headers)


def _backend_message(raw: bytes) -> tuple[str, str | None]:
    """Best-effort (message, type) from a backend error body (vLLM or other)."""
    text = raw[:1000].decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(raw)
    except ValueError:
        return text or "(empty body)", None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"]), _str_or_none(err.get("type"))
        if "message" in data:
            return str(data["message"]), _str_or_none(data.get("type"))
    return text, None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's request: compute the prompt's KV, emit one token, keep the KV."""
    out = dict(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(key, None)
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return out


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class _Proxy:
    """State shared by the handlers of one app: session, round-robin, health."""

    def __init__(self, config: ProxyConfig) -> None:
        self.cfg = config
        self.session: aiohttp.ClientSession | None = None
        self.urls: dict[Role, list[str]] = {"prefill": config.prefill, "decode": config.decode}
        self._rr: dict[Role, itertools.count[int]] = {r: itertools.count() for r in self.urls}
        self.healthy: dict[tuple[Role, str], bool] = {
            (role, url): False for role, urls in self.urls.items() for url in urls
        }
        connect = min(MAX_CONNECT_S, config.request_timeout_s)
        self.leg_timeout = aiohttp.ClientTimeout(total=config.request_timeout_s, sock_connect=connect)
        # sock_read restarts on every received byte (and pauses under client
        # back-pressure), which is exactly a stream idle timeout.
        self.stream_timeout = aiohttp.ClientTimeout(
            total=config.request_timeout_s, sock_connect=connect, sock_read=config.stream_idle_timeout_s
        )

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self.session is not None, "proxy app not started"
        return self.session

    def pick(self, role: Role) -> str:
        urls = self.urls[role]
        return urls[next(self._rr[role]) % len(urls)]

    def ready(self, role: Role) -> int:
        return sum(self.healthy[(role, url)] for url in self.urls[role])

    # -- lifecycle ---------------------------------------------------------

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        # limit=0: the benchmark sets concurrency; the proxy must not cap it.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.leg_timeout)
        poller = asyncio.create_task(self._health_loop(), name="pdbench-proxy-health")
        try:
            yield
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await self.session.close()
            self.session = None

    async def _health_loop(self) -> None:
        while True:
            try:
                await asyncio.gather(*(self._poll(role, url) for role, url in self.healthy))
            except Exception as exc:  # keep polling whatever happens
                log.warning("health poll error: %s", _describe(exc))
            await asyncio.sleep(self.cfg.health_interval_s)

    async def _poll(self, role: Role, url: str) -> None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_timeout_s)
        try:
            async with self.http.get(f"{url}/health", timeout=timeout) as resp:
                ok, reason = resp.status == 200, f"HTTP {resp.status}"
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            ok, reason = False, _describe(exc)
        was = self.healthy[(role, url)]
        self.healthy[(role, url)] = ok
        # Log transitions only: a backend loading for minutes must not flood the log.
        if ok and not was:
            log.info("%s %s is healthy", role, url)
        elif was and not ok:
            log.warning("%s %s became unhealthy: %s", role, url, reason)

    # -- handlers ----------------------------------------------------------

    async def handle_health(self, request: web.Request) -> web.Response:
        n_p, n_d = self.ready("prefill"), self.ready("decode")
        exp_p, exp_d = len(self.cfg.prefill), len(self.cfg.decode)
        ok = n_p == exp_p and n_d == exp_d
        body = {
            "status": "ok" if ok else "not_ready",
            "prefill_instances": n_p,
            "decode_instances": n_d,
            "expected_prefill": exp_p,
            "expected_decode": exp_d,
        }
        return web.json_response(body, status=200 if ok else 503)

    async def handle_models(self, request: web.Request) -> web.Response:
        decodes = self.cfg.decode
        url = next((u for u in decodes if self.healthy[("decode", u)]), decodes[0])
        headers = _auth_headers(request)
        timeout = aiohttp.ClientTimeout(total=min(MAX_MODELS_S, self.cfg.request_timeout_s))
        try:
            async with self.http.get(f"{url}/v1/models", headers=headers, timeout=timeout) as resp:
                raw = await resp.read()
                ctype = resp.headers.get("Content-Type", "application/json")
                return web.Response(body=raw, status=resp.status, headers={"Content-Type": ctype})
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            log.warning("decode %s /v1/models failed: %s", url, _describe(exc))
            return error_response(502, f"decode /v1/models failed: {_describe(exc)}", "connection_error", url)

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:  # includes bad UTF-8
            return error_response(400, f"malformed JSON body: {exc}", "invalid_request_error")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object", "invalid_request_error")

        rid = str(uuid.uuid4())
        headers = {"Content-Type": "application/json", "X-Request-Id": rid, **_auth_headers(request)}
        p_url = self.pick("prefill")
        try:
            kv = await self._prefill(p_url, request.path, body, headers, rid)
        except UpstreamError as err:
            log.warning("prefill %s failed (request %s): %s", err.backend, rid, err.message)
            return err.response(rid)

        decode_body = dict(body)
        if kv:
            decode_body["kv_transfer_params"] = kv
        return await self._decode(request, self.pick("decode"), decode_body, headers, rid)

    async def _prefill(
        self, url: str, path: str, body: dict[str, Any], headers: dict[str, str], rid: str
    ) -> Any:
        """Run the prefill leg; returns its kv_transfer_params (None if absent)."""
        try:
            async with self.http.post(url + path, data=_dumps(prefill_body(body)), headers=headers) as resp:
                status, raw = resp.status, await resp.read()
        except asyncio.TimeoutError:
            msg = f"prefill timed out after {self.cfg.request_timeout_s}s"
            raise UpstreamError(url, 502, "timeout", msg) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(url, 502, "connection_error", f"prefill failed: {_describe(exc)}") from None
        if not 200 <= status < 300:
            raise UpstreamError.from_status(url, "prefill", status, raw)
        try:
            data = json.loads(raw)
        except ValueError:
            raise UpstreamError(url, 502, "invalid_upstream_response", "prefill returned non-JSON") from None
        kv = data.get("kv_transfer_params") if isinstance(data, dict) else None
        if not kv:
            # e.g. the one token was EOS, or prefill runs without a KV connector:
            # decode then recomputes the prompt, which skews PD measurements.
            log.warning("prefill %s returned no kv_transfer_params (request %s)", url, rid)
        return kv

    async def _decode(
        self, request: web.Request, url: str, body: dict[str, Any], headers: dict[str, str], rid: str
    ) -> web.StreamResponse:
        """Run the decode leg, relaying its bytes to the client as they arrive."""
        timeout = self.stream_timeout if body.get("stream") else self.leg_timeout
        try:
            up = await self.http.post(
                url + request.path, data=_dumps(body), headers=headers, timeout=timeout
            )
        except asyncio.TimeoutError:
            log.warning("decode %s timed out (request %s)", url, rid)
            return error_response(502, "decode timed out", "timeout", url, rid)
        except aiohttp.ClientError as exc:
            log.warning("decode %s failed (request %s): %s", url, rid, _describe(exc))
            return error_response(502, f"decode failed: {_describe(exc)}", "connection_error", url, rid)

        finished = False
        try:
            if not 200 <= up.status < 300:
                try:
                    raw = await up.read()
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    raw = b""
                err = UpstreamError.from_status(url, "decode", up.status, raw)
                log.warning("decode %s failed (request %s): %s", url, rid, err.message)
                return err.response(rid)

            ctype = up.headers.get("Content-Type", "application/json")
            resp_headers = {"Content-Type": ctype, "X-Request-Id": rid}
            resp = web.StreamResponse(status=up.status, headers=resp_headers)
            try:
                await resp.prepare(request)
                while True:
                    try:
                        chunk = await up.content.readany()
                    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                        kind, msg = self._stream_failure(exc)
                        return await self._abort(request, resp, url, rid, kind, msg)
                    if not chunk:
                        finished = True
                        return resp
                    await resp.write(chunk)
            except ConnectionError:
                # Client went away mid-response (without handler cancellation).
                log.info("client disconnected (request %s)", rid)
                return resp
        finally:
            # Closing (not releasing) an unfinished response drops the upstream
            # connection, which makes vLLM abort the request and free its KV.
            if finished:
                up.release()
            else:
                up.close()

    def _stream_failure(self, exc: BaseException) -> tuple[str, str]:
        """(type, message) of an error while relaying the decode body."""
        if isinstance(exc, aiohttp.ServerTimeoutError):  # sock_read: the idle timeout
            return "stream_idle_timeout", f"decode sent nothing for {self.cfg.stream_idle_timeout_s}s"
        if isinstance(exc, asyncio.TimeoutError):
            return "timeout", f"decode exceeded {self.cfg.request_timeout_s}s"
        return "connection_error", _describe(exc)

    async def _abort(
        self, request: web.Request, resp: web.StreamResponse, url: str, rid: str, kind: str, msg: str
    ) -> web.StreamResponse:
        """End a response already under way: headers are sent, so no error status is possible."""
        log.warning("decode %s aborted (request %s): %s", url, rid, msg)
        if resp.content_type == "text/event-stream":
            event = {"error": {"message": msg, "backend": url, "type": kind}}
            try:
                await resp.write(b"data: " + _dumps(event) + b"\n\n")
            except ConnectionError:
                pass
        # Closing the socket without the final chunk makes the client see a
        # truncated (failed) response rather than a clean end.
        if request.transport is not None:
            request.transport.close()
        return resp


def _auth_headers(request: web.Request) -> dict[str, str]:
    auth = request.headers.get("Authorization")
    return {"Authorization": auth} if auth else {}


PROXY_KEY = web.AppKey("pdbench_proxy", _Proxy)


def build_app(config: ProxyConfig) -> web.Application:
    """The proxy's aiohttp application (session and health polling live with it)."""
    proxy = _Proxy(config)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[PROXY_KEY] = proxy
    app.cleanup_ctx.append(proxy.lifespan)
    app.router.add_post("/v1/completions", proxy.handle_generate)
    app.router.add_post("/v1/chat/completions", proxy.handle_generate)
    app.router.add_get("/health", proxy.handle_health)
    app.router.add_get("/v1/models", proxy.handle_models)
    return app


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve(config: ProxyConfig) -> None:
    """Run the proxy until SIGINT/SIGTERM."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info(
        "pdbench proxy on %s:%d connector=%s prefill=%s decode=%s",
        config.host, config.port, config.connector, config.prefill, config.decode,
    )
    web.run_app(
        build_app(config),
        host=config.host,
        port=config.port,
        loop=_new_loop(),
        # Cancel the handler (and so the upstream legs) when the client disconnects.
        handler_cancellation=True,
        access_log=None,  # one line per request would cost more than the proxying
        print=None,
    )
