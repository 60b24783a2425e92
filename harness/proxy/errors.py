"""The proxy's error answers: a failed upstream leg as a JSON error naming the backend."""

from __future__ import annotations

from harness.proxy.flows import loads
from harness.proxy.http import Reply, json_reply

# Backend messages quoted in errors and logs are cut to this.
MAX_QUOTE = 500


class UpstreamError(Exception):
    """A failed upstream leg, rendered as a JSON error naming the backend."""

    def __init__(self, backend: str, status: int, kind: str, message: str, category: str | None = None) -> None:
        super().__init__(message)
        self.backend, self.status, self.kind, self.message = backend, status, kind, message
        # A fixed set of metric labels (kind may be a backend's own error type).
        self.category = category or kind

    @classmethod
    def from_status(cls, backend: str, leg: str, status: int, raw: bytes) -> UpstreamError:
        msg, kind = _backend_message(raw)
        # A 4xx is the backend rejecting the request: the client should see it
        # as such. Anything else is the backend failing: a gateway error.
        if 400 <= status < 500:
            return cls(
                backend, status, kind or "upstream_error", f"{leg} returned HTTP {status}: {msg}", "upstream_4xx"
            )
        return cls(backend, 502, "upstream_error", f"{leg} returned HTTP {status}: {msg}", "upstream_5xx")

    @property
    def backend_fault(self) -> bool:
        """A 5xx of the backend's making; not the proxy's own shortage (kind proxy_resources, a 503)."""
        return self.status >= 500 and self.kind != "proxy_resources"

    def response(self, request_id: str | None = None) -> Reply:
        return error_response(self.status, self.message, self.kind, self.backend, request_id)


def error_response(
    status: int, message: str, kind: str, backend: str | None = None, request_id: str | None = None
) -> Reply:
    headers = {"X-Request-Id": request_id} if request_id else None
    return json_reply(
        {"error": {"message": message, "type": kind, "backend": backend, "code": status}}, status, headers
    )


def _backend_message(raw: bytes) -> tuple[str, str | None]:
    """Best-effort (message, type) from a backend error body (vLLM or other)."""
    text = raw[:MAX_QUOTE].decode("utf-8", errors="replace").strip()
    try:
        data = loads(raw)
    except Exception:
        return text or "(empty body)", None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:MAX_QUOTE], _str_or_none(err.get("type"))
        if "message" in data:
            return str(data["message"])[:MAX_QUOTE], _str_or_none(data.get("type"))
    return text, None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def describe(exc: BaseException) -> str:
    text = str(exc)[:MAX_QUOTE]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
