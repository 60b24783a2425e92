"""MoRI-IO service discovery: a ZMQ ROUTER socket that instances register with.

Both protocol generations are accepted (prior-systems.md §3c):

- Gen-1: ``{"type": "register", "role": "P"|"D", "index", "request_address":
  "http://ip:port/v1/completions", "handshake_port", "notify_port", "dp_size",
  "tp_size", "transfer_mode"}``, sent once per instance (and rank).
- Gen-2: ``{"type": "P"|"D", "http_address": "ip:port", "zmq_address":
  "host:IP,handshake:PORT,notify:PORT", "dp_size", "tp_size", "transfer_mode"}``,
  re-sent every few seconds as a heartbeat.

Both are msgpack. Every message is an upsert keyed by the instance's HTTP address
and role, so duplicates and heartbeats never add a second entry (the Gen-1 proxies
compared the address string against stored dicts and so never deduplicated).
``{"type": "HELLO"}`` is ignored. All instances must agree on one transfer mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from harness.proxy.backends import Backend, Pool, Role

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024  # a registration is a few hundred bytes
_ROLE: dict[str, Role] = {"P": "prefill", "D": "decode"}


class RegistrationError(ValueError):
    pass


def _int(msg: dict[str, Any], key: str, default: int | None = None) -> int:
    v = msg.get(key, default)
    if v is None:
        raise RegistrationError(f"missing '{key}'")
    if isinstance(v, bool):
        raise RegistrationError(f"'{key}' must be an integer")
    try:
        out = int(v)
    except (TypeError, ValueError):
        raise RegistrationError(f"'{key}' must be an integer, got {v!r:.40}") from None
    if out < 0 or out > 1 << 20:
        raise RegistrationError(f"'{key}' out of range: {out}")
    return out


def _str(msg: dict[str, Any], key: str) -> str:
    v = msg.get(key)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if not isinstance(v, str) or not v or len(v) > 512:
        raise RegistrationError(f"'{key}' must be a non-empty string")
    return v


def _mode(msg: dict[str, Any]) -> str:
    v = msg.get("transfer_mode", "WRITE")
    if isinstance(v, bytes):
        v = v.decode()
    mode = str(v).lower()
    if mode not in ("read", "write"):
        raise RegistrationError(f"'transfer_mode' must be READ or WRITE, got {v!r:.40}")
    return mode


def parse_zmq_address(text: str) -> tuple[str, int, int]:
    """'host:IP,handshake:PORT,notify:PORT' -> (IP, handshake, notify); split on the first ':'."""
    parts: dict[str, str] = {}
    for segment in text.split(","):
        key, _, val = segment.partition(":")
        parts[key.strip()] = val.strip()
    try:
        return parts["host"], int(parts["handshake"]), int(parts["notify"])
    except (KeyError, ValueError):
        raise RegistrationError(f"malformed zmq_address {text!r:.100}") from None


def parse_registration(msg: Any) -> dict[str, Any] | None:
    """A registration in one shape for both generations; None for messages to ignore."""
    if not isinstance(msg, dict):
        raise RegistrationError("message must be a map")
    kind = msg.get("type")
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    if kind == "HELLO":
        return None
    if kind == "register":  # Gen-1
        role = _ROLE.get(msg.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise RegistrationError(f"'role' must be P or D, got {msg.get('role')!r:.40}")
        addr = urlsplit(_str(msg, "request_address"))
        if addr.scheme not in ("http", "https") or not addr.hostname or addr.port is None:
            raise RegistrationError(f"bad request_address {msg.get('request_address')!r:.100}")
        hs, nt = _int(msg, "handshake_port"), _int(msg, "notify_port")
        return {
            "gen": "gen1",
            "role": role,
            "url": f"{addr.scheme}://{addr.netloc}",
            "handshake_port": hs,
            "notify_port": nt,
            "zmq_address": f"host:{addr.hostname},handshake:{hs},notify:{nt}",
            "dp_size": max(1, _int(msg, "dp_size", 1)),
            "tp_size": max(1, _int(msg, "tp_size", 1)),
            "mode": _mode(msg),
        }
    if kind in _ROLE:  # Gen-2
        http = _str(msg, "http_address")
        url = http if "://" in http else f"http://{http}"
        parts = urlsplit(url)
        if not parts.hostname or parts.port is None:
            raise RegistrationError(f"bad http_address {http!r:.100}")
        zmq_address = _str(msg, "zmq_address")
        _, hs, nt = parse_zmq_address(zmq_address)
        return {
            "gen": "gen2",
            "role": _ROLE[kind],
            "url": f"{parts.scheme}://{parts.netloc}",
            "handshake_port": hs,
            "notify_port": nt,
            "zmq_address": zmq_address,
            "dp_size": max(1, _int(msg, "dp_size", 1)),
            "tp_size": max(1, _int(msg, "tp_size", 1)),
            "mode": _mode(msg),
        }
    raise RegistrationError(f"unknown message type {kind!r:.40}")


class Registry:
    """Applies registrations to the pool; the ZMQ socket loop lives in `serve`."""

    def __init__(
        self,
        pool: Pool,
        mode: str | None,
        on_mode: Callable[[str], None],
        on_result: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.pool = pool
        self.mode = mode
        self.on_mode = on_mode
        self.on_result = on_result
        if mode:
            on_mode(mode)

    def apply(self, reg: dict[str, Any], now: float | None = None) -> Backend | None:
        now = time.monotonic() if now is None else now
        if self.mode is None:
            self.mode = reg["mode"]
            self.on_mode(reg["mode"])
            log.info("MoRI-IO transfer mode %s (from the first registration)", self.mode.upper())
        elif reg["mode"] != self.mode:
            raise RegistrationError(
                f"{reg['role']} {reg['url']} registered transfer_mode {reg['mode'].upper()}, "
                f"but the proxy runs {self.mode.upper()}"
            )
        b = self.pool.find(reg["role"], reg["url"])
        fields = {k: reg[k] for k in ("handshake_port", "notify_port", "zmq_address", "dp_size", "tp_size")}
        if b is None:
            if len(self.pool.all()) >= self.pool.cfg.max_registered:
                raise RegistrationError(f"too many instances ({self.pool.cfg.max_registered}); ignoring {reg['url']}")
            b = self.pool.add(
                Backend(
                    role=reg["role"],
                    url=reg["url"],
                    source=reg["gen"],
                    transfer_mode=reg["mode"],
                    last_seen=now,
                    **fields,
                )
            )
            log.info("registered %s (%s, dp=%d tp=%d %s)", b.label, reg["gen"], b.dp_size, b.tp_size, b.zmq_address)
            self.on_result("new")
            return b
        changed = any(getattr(b, k) != v for k, v in fields.items()) or b.source != reg["gen"]
        for k, v in fields.items():
            setattr(b, k, v)
        b.source, b.last_seen = reg["gen"], now
        if changed:
            log.info("re-registered %s with new details (%s)", b.label, b.zmq_address)
            self.on_result("updated")
        else:
            self.on_result("heartbeat")
        return b

    def handle(self, raw: bytes) -> None:
        """One raw message from the socket; never raises."""
        import msgpack

        try:
            msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            log.warning("ignoring a registration that is not msgpack: %s", exc)
            self.on_result("invalid")
            return
        try:
            reg = parse_registration(msg)
            if reg is not None:
                self.apply(reg)
        except RegistrationError as exc:
            log.warning("ignoring registration: %s", exc)
            self.on_result("rejected")

    def expire(self, now: float, ttl: float) -> None:
        """Forget Gen-2 instances whose heartbeat stopped long ago (bounded memory)."""
        for b in list(self.pool.all()):
            if b.source == "gen2" and now - b.last_seen > max(10 * ttl, 300.0) and b.load() == 0:
                log.warning("forgetting %s: no heartbeat for %.0fs", b.label, now - b.last_seen)
                self.pool.remove(b)

    async def serve(self, host: str, port: int, bound: asyncio.Future | None = None) -> None:
        """Receive registrations until cancelled."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            if ":" in host:  # an IPv6 literal
                sock.setsockopt(zmq.IPV6, 1)
                host = f"[{host.strip('[]')}]"
            sock.bind(f"tcp://{host}:{port}")
            log.info("MoRI-IO registration on %s", sock.getsockopt_string(zmq.LAST_ENDPOINT))
            if bound is not None and not bound.done():
                bound.set_result(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            while True:
                frames = await sock.recv_multipart()
                # ROUTER prepends the sender's identity; the payload is the last frame.
                if len(frames) >= 2:
                    self.handle(frames[-1])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if bound is not None and not bound.done():
                bound.set_exception(exc)
            raise
        finally:
            sock.close(0)
            ctx.term()
