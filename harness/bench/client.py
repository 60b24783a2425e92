"""One streaming request against an OpenAI-compatible endpoint, timed per chunk.

Timing follows vLLM's `async_request_openai_completions`: start when the request
is sent, TTFT at the first chunk carrying `choices` (its text may be empty, e.g.
for special tokens), one ITL entry per later such chunk, latency at the last one.
Stricter than vLLM: a stream without `data: [DONE]` or with an `{"error": ...}`
chunk fails the request, so a truncated stream is never counted as a success.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class RequestOutput:
    prompt_len: int
    expected_output_len: int
    success: bool = False
    output_tokens: int = 0
    ttft: float = 0.0  # s
    itl: list[float] = field(default_factory=list)  # s, gaps between content chunks
    latency: float = 0.0  # s, send to last content chunk
    start_time: float | None = None  # perf_counter at send; None if never sent
    end_time: float | None = None  # perf_counter when the request finished or failed
    error: str = ""


class RequestFailed(Exception):
    """A response that arrived but cannot count as a success."""


def build_payload(
    endpoint: str, model: str, prompt: str, max_tokens: int, ignore_eos: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if endpoint == "chat":
        # The chat template adds tokens, so the server-side prompt is longer than isl.
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _error_text(msg: dict[str, Any]) -> str | None:
    """vLLM streams errors as {"error": {...}}; some servers send {"object": "error"}."""
    if msg.get("error"):
        err = msg["error"]
        return json.dumps(err) if not isinstance(err, str) else err
    if msg.get("object") == "error":
        return str(msg.get("message", msg))
    return None


def _is_content_chunk(msg: dict[str, Any]) -> bool:
    choices = msg.get("choices")
    if not choices:
        return False  # e.g. the final usage-only chunk
    delta = choices[0].get("delta")
    if delta is None:
        return True  # completions: every choices chunk is a generated token
    # chat: skip the role-announcement chunk that carries no generated text
    return not (delta.get("role") and not delta.get("content") and not delta.get("reasoning_content"))


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    timeout_s: float,
    out: RequestOutput,
) -> RequestOutput:
    """Fill `out` in place (so a cancelled request keeps its start time); never raises
    except on cancellation."""
    start = out.start_time = time.perf_counter()
    last = start
    chunks = 0
    usage_tokens: int | None = None
    done = False
    try:
        async with session.post(
            url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                body = (await resp.text())[:500]
                raise RequestFailed(f"HTTP {resp.status} {resp.reason}: {body}")
            async for raw in resp.content:  # one SSE line at a time
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, ": ping" comments, event:/id: fields
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    break
                msg = json.loads(data)
                if (err := _error_text(msg)) is not None:
                    raise RequestFailed(f"error in stream: {err}")
                if _is_content_chunk(msg):
                    now = time.perf_counter()
                    if chunks == 0:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                    chunks += 1
                if usage := msg.get("usage"):
                    usage_tokens = usage.get("completion_tokens")
        if not done:
            raise RequestFailed("stream ended without data: [DONE]")
        if chunks == 0:
            raise RequestFailed("stream had no content chunk")
        out.latency = last - start
        out.output_tokens = usage_tokens if usage_tokens is not None else chunks
        out.success = True
    except asyncio.TimeoutError:
        out.error = f"timeout: no complete response within request_timeout_s={timeout_s:g}"
    except RequestFailed as e:
        out.error = str(e)
    except Exception as e:  # noqa: BLE001 - connection errors, bad JSON: the request fails, the sweep goes on
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.end_time = time.perf_counter()
    return out
