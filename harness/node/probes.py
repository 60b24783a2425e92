"""HTTP probes of the node runtime: health checks and the smoke request (stdlib, bounded)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request


def is_healthy(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError, ValueError, http.client.HTTPException):
        return False


def smoke_request(base_url: str, model: str, timeout: float) -> str:
    """One short completion through the proxy; returns the text or raises RuntimeError."""
    body = json.dumps(
        {"model": model, "prompt": "pdbench smoke test", "max_tokens": 4, "temperature": 0, "stream": False}
    ).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"smoke request got HTTP {e.code}: {e.read()[:500]!r}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise RuntimeError(f"smoke request failed: {e}") from None
    try:
        return data["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        raise RuntimeError(f"smoke request returned no completion: {str(data)[:500]}") from None
