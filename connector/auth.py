"""Mutual challenge-response on every KV connection, before any other message.

The prefill KV server streams a request's KV to whoever asks for it by id, so a
connection must first prove it belongs to the job: both ends know the job's secret
(connector/config.py says where it comes from) and prove it without sending it:

    server -> client  {"op": "challenge", "v": 1, "nonce": sn}
    client -> server  {"op": "auth", "nonce": cn, "mac": HMAC(key, "client" sn cn)}
    server -> client  {"ok": true, "mac": HMAC(key, "server" sn cn)}
                    | {"ok": false, "error": "authentication failed"}, then close

HMAC-SHA256 over fresh random nonces of both sides, so a recorded exchange cannot be
replayed and decode also knows it reached the job's prefill. Comparisons are
constant-time (hmac.compare_digest). Frames before authentication are small and
bounded in time (`io_timeout_s`), so an unauthenticated peer holds little.

Without a secret both ends use the empty key: the handshake still runs (one code
path, and a secret configured on one side only fails loudly), and KVServer then
listens only on loopback (see KVServer.start).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from typing import Any

from connector.protocol import PeerError, recv_frame, send_frame

VERSION = 1
HELLO_MAX = 4096  # bytes of a pre-authentication frame
_NONCE_HEX = 32


class AuthError(PeerError):
    """The peer does not know the job secret (or does not speak this handshake)."""


def _mac(key: bytes, who: bytes, server_nonce: str, client_nonce: str) -> str:
    msg = b"pdbench-kv-v1|" + who + b"|" + server_nonce.encode() + b"|" + client_nonce.encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def _equal(expected: str, got: Any) -> bool:
    return isinstance(got, str) and hmac.compare_digest(expected.encode(), got.encode("utf-8", "replace"))


def _nonce(msg: dict[str, Any]) -> str:
    n = msg.get("nonce")
    if not isinstance(n, str) or not 16 <= len(n) <= 128:
        raise AuthError("malformed handshake")
    return n


async def server_handshake(sock: socket.socket, key: bytes, timeout: float) -> None:
    """Raises AuthError (after telling the peer) unless the peer proves it knows `key`."""
    sn = secrets.token_hex(_NONCE_HEX // 2)
    await send_frame(sock, {"op": "challenge", "v": VERSION, "nonce": sn}, timeout)
    msg = await recv_frame(sock, timeout, limit=HELLO_MAX)
    try:
        if msg.get("op") != "auth":
            raise AuthError(f"expected the authentication handshake, got op {str(msg.get('op'))[:40]!r}")
        cn = _nonce(msg)
        if not _equal(_mac(key, b"client", sn, cn), msg.get("mac")):
            raise AuthError("authentication failed (wrong or missing job secret)")
    except AuthError:
        await send_frame(sock, {"ok": False, "error": "authentication failed"}, timeout)
        raise
    await send_frame(sock, {"ok": True, "mac": _mac(key, b"server", sn, cn)}, timeout)


async def client_handshake(sock: socket.socket, key: bytes, timeout: float) -> None:
    """Raises AuthError unless the server accepts our proof and proves it knows `key` too."""
    ch = await recv_frame(sock, timeout, limit=HELLO_MAX)
    if ch.get("op") != "challenge" or ch.get("v") != VERSION:
        raise AuthError(f"unexpected greeting from the KV server: {str(ch)[:100]}")
    sn = _nonce(ch)
    cn = secrets.token_hex(_NONCE_HEX // 2)
    await send_frame(sock, {"op": "auth", "nonce": cn, "mac": _mac(key, b"client", sn, cn)}, timeout)
    resp = await recv_frame(sock, timeout, limit=HELLO_MAX)
    if not resp.get("ok"):
        raise AuthError(
            f"the KV server refused this worker: {str(resp.get('error'))[:100]} "
            "(do both sides use the same job secret?)"
        )
    if not _equal(_mac(key, b"server", sn, cn), resp.get("mac")):
        raise AuthError("the KV server could not prove it knows the job secret")
