"""Request validation and the per-connector shape of the prefill and decode legs.

Pure functions of the client's body and the chosen instances, so each flow is tested
without sockets. The flows follow vLLM's own proxies (see
shared/design/research/prior-systems.md §3):

- nixl, pdbench: two phases. Prefill computes the prompt's KV and returns
  ``kv_transfer_params``; decode gets the original request plus those params.
- moriio: WRITE (prefill pushes KV, legs concurrent) or READ (prefill first, decode
  pulls with what prefill answered, forwarded as it is); Gen-1 (explicit host/ports) or
  Gen-2 (peer addresses inside the request id) params; decode's token limit minus one.
- mooncake: a transfer id and the prefill's bootstrap address agreed up front, so the
  legs run concurrently.
"""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

from harness import kv_connectors
from harness.proxy.backends import Backend, hash64

try:  # orjson is several times faster; the stdlib is the fallback.
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    loads = orjson.loads
    JSONDecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised only without orjson

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    loads = json.loads  # type: ignore[assignment]  # same contract as orjson.loads
    JSONDecodeError = (ValueError,)


class BadRequest(Exception):
    """The client's request is malformed: a 400 naming the problem."""


# Fields the proxy reads or rewrites, with the JSON types it accepts (None = null).
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens", "min_completion_tokens", "n")
_PREFILL_DROP = ("stream_options", "min_tokens", "min_completion_tokens")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_request(raw: bytes, chat: bool) -> dict[str, Any]:
    """The client's JSON body, checked only as far as the proxy relies on it."""
    if not raw:
        raise BadRequest("empty request body")
    try:
        body = loads(raw)
    except JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    for name in _INT_FIELDS:
        v = body.get(name)
        if v is not None and (not _is_int(v) or v < 0):
            raise BadRequest(f"'{name}' must be a non-negative integer, got {type(v).__name__} {v!r:.40}")
    for name in ("max_tokens", "max_completion_tokens"):
        if body.get(name) == 0:
            raise BadRequest(f"'{name}' must be at least 1")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {type(stream).__name__}")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        if not all(isinstance(m, dict) for m in msgs):
            raise BadRequest("every entry of 'messages' must be an object")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if not prompt or not all(isinstance(p, (str, int, list)) and not isinstance(p, bool) for p in prompt):
                raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids")
        elif not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids")
    # The proxy owns the KV handshake: a client's own params would only confuse it.
    body.pop("kv_transfer_params", None)
    return body


def affinity_key(body: dict[str, Any], chars: int) -> int:
    """Hash of the prompt's beginning: requests sharing a prefix go to the same instance."""
    prompt = body.get("prompt")
    if prompt is None:
        parts: list[str] = []
        size = 0
        for m in body.get("messages") or ():
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # multi-part content: its text parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            text = f"{m.get('role', '')}:{content or ''}\n" if isinstance(m, dict) else ""
            parts.append(text)
            size += len(text)
            if size >= chars:
                break
        text = "".join(parts)[:chars]
    elif isinstance(prompt, str):
        text = prompt[:chars]
    else:
        first = prompt[0] if prompt and isinstance(prompt[0], (str, list)) else prompt
        text = first[:chars] if isinstance(first, str) else repr(first[: max(1, chars // 4)])
    return hash64(text.encode("utf-8", "surrogatepass"))


def _prefill_base(body: dict[str, Any]) -> dict[str, Any]:
    """Compute the prompt's KV and one token, non-streaming, and keep the KV for decode."""
    out = dict(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    for key in _PREFILL_DROP:  # streaming options and min tokens do not apply to one token
        out.pop(key, None)
    # Every connector hands the KV over only when prefill stops at its token cap
    # (FINISHED_LENGTH_CAPPED): a stop string or stop token, or EOS as the one token, would
    # free the blocks and leave decode to recompute the prompt. As vLLM-Omni's PD flow does:
    # no stops, and EOS masked for the one token.
    out.pop("stop", None)
    out.pop("stop_token_ids", None)
    out["min_tokens"] = 1
    return out


def random_id() -> str:
    """128 random bits in hex, unique per request like a UUID4. From the random module's
    generator, not os.urandom: a getrandom syscall per request is measurable CPU at load,
    and the ids need to be unique, not secret (CPython reseeds the generator in a forked
    child, so `--workers` processes never share a sequence)."""
    return f"{random.getrandbits(128):032x}"


class Flow:
    """How one connector splits a request into a prefill and a decode leg."""

    concurrent = False  # run both legs at once (prefill's response is not needed by decode)

    @classmethod
    def configured(cls, moriio_mode: str | None, overlap: bool) -> Flow:
        """This flow for the proxy's settings (a flow reads those that apply to it)."""
        return cls()

    def concurrent_with(self, p: Backend) -> bool:
        """Whether this request's two legs to prefill `p` go out at once."""
        return self.concurrent

    def prefill_answered(self, p: Backend, kv: Any) -> None:
        """Prefill `p` answered a leg with these kv_transfer_params (what a flow may learn)."""

    def request_id(self, p: Backend, d: Backend) -> str:
        return random_id()

    def transfer_id(self, rid: str) -> str | None:
        return None

    def prefill(self, body: dict[str, Any], p: Backend, rank: int, d: Backend, tid: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def prefill_headers(self, p: Backend, rank: int) -> dict[str, str]:
        if p.dp_size > 1:
            return {"X-data-parallel-rank": str(rank)}
        return {}

    def decode(
        self, body: dict[str, Any], p: Backend, rank: int, d: Backend, tid: str | None, kv: dict | None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def missing_kv(self, kv: dict | None) -> bool:
        """Sequential flows: the prefill response lacks what decode needs (decode recomputes)."""
        return False

    def tag_decode(self, leg: dict[str, Any], tag: str | None) -> dict[str, Any]:
        """Decode's leg (from `decode`) of a request the client timed as `tag`, its X-Pdbench-Id
        (None: not timed). Only a connector that records per-request timings of its own takes it."""
        return leg


class TwoPhaseFlow(Flow):
    """NIXL and the bundled pdbench connector: decode gets prefill's kv_transfer_params."""

    PREFILL_KV: ClassVar[dict[str, Any]] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }

    def prefill(self, body, p, rank, d, tid):
        out = _prefill_base(body)
        out["kv_transfer_params"] = dict(self.PREFILL_KV)
        return out

    def prefill_headers(self, p: Backend, rank: int) -> dict[str, str]:
        return {}  # NIXL's params carry the engine (and so the DP rank) back to decode

    def decode(self, body, p, rank, d, tid, kv):
        if not kv:
            # e.g. the one token was EOS, or prefill runs without a KV connector:
            # decode then recomputes the prompt, which skews PD measurements.
            return body
        out = dict(body)
        out["kv_transfer_params"] = kv
        return out

    def missing_kv(self, kv: dict | None) -> bool:
        return not kv


class PdbenchFlow(TwoPhaseFlow):
    """The bundled connector. Prefill holds the blocks under the proxy's pull key (the
    transfer id), so with `overlap` decode need not wait for prefill's answer: once a
    prefill instance's KV endpoint is known (from its first answer), both legs go out at
    once and decode's pull waits at prefill (connector `early_wait_s`) until the KV is
    there. Decode's front end (HTTP, tokenising, scheduling, block allocation) then runs
    while prefill computes instead of after it. Prefill DP > 1 stays two-phase: which DP
    rank (and KV port) takes a request is only known from its answer."""

    def __init__(self, overlap: bool = False) -> None:
        self.overlap = overlap

    @classmethod
    def configured(cls, moriio_mode: str | None, overlap: bool) -> Flow:
        return cls(overlap)

    def concurrent_with(self, p: Backend) -> bool:
        return self.overlap and p.kv_endpoint is not None and p.dp_size == 1

    def transfer_id(self, rid: str) -> str:
        return f"pd-{rid}"

    def prefill(self, body, p, rank, d, tid):
        out = super().prefill(body, p, rank, d, tid)
        out["kv_transfer_params"]["pull_key"] = tid
        return out

    def decode(self, body, p, rank, d, tid, kv):
        if kv is not None or not self.concurrent_with(p):
            return super().decode(body, p, rank, d, tid, kv)
        assert p.kv_endpoint is not None
        out = dict(body)
        out["kv_transfer_params"] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            **p.kv_endpoint,
            "remote_request_id": tid,
            "pull_key": tid,  # tells decode's connector the pull may wait for prefill
        }
        return out

    def tag_decode(self, leg: dict[str, Any], tag: str | None) -> dict[str, Any]:
        params = leg.get("kv_transfer_params")
        if tag is None or not isinstance(params, dict):
            return leg  # untimed, or decode recomputes: no load to time
        # Decode's connector keys its per-request load timings by the client's id.
        return {**leg, "kv_transfer_params": {**params, "pdbench_id": tag}}

    def prefill_answered(self, p: Backend, kv: Any) -> None:
        # Every answer, so a restarted prefill (a new engine id) is followed.
        if isinstance(kv, dict) and all(kv.get(k) for k in ("remote_engine_id", "remote_host", "remote_port")):
            tp = kv.get("tp_size")
            p.kv_endpoint = {
                "remote_engine_id": str(kv["remote_engine_id"]),
                "remote_host": str(kv["remote_host"]),
                "remote_port": kv["remote_port"],
                "tp_size": tp if isinstance(tp, int) and tp > 0 else 1,
            }


class MoriioFlow(Flow):
    """MoRI-IO, both registration generations, READ or WRITE."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # "read" | "write"; fixed by the flag or the first registration

    @classmethod
    def configured(cls, moriio_mode: str | None, overlap: bool) -> Flow:
        return cls(moriio_mode or "write")

    @property
    def concurrent(self) -> bool:  # type: ignore[override]
        return self.mode == "write"

    def request_id(self, p: Backend, d: Backend) -> str:
        # Current vLLM parses the peers' ZMQ addresses out of the request id.
        return f"___prefill_addr_{p.zmq_address}___decode_addr_{d.zmq_address}_{random_id()}"

    def transfer_id(self, rid: str) -> str:
        return f"tx-{random_id()}"

    @staticmethod
    def _gen1(p: Backend, d: Backend) -> bool:
        return p.source != "gen2" or d.source != "gen2"

    def prefill(self, body, p, rank, d, tid):
        out = _prefill_base(body)
        kv: dict[str, Any] = {
            "remote_dp_size": d.dp_size,
            "remote_tp_size": d.tp_size,
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "transfer_id": tid,
        }
        if self._gen1(p, d):  # older connectors read the peer from explicit fields
            kv.update(
                remote_handshake_port=d.handshake_port,
                remote_notify_port=d.notify_port,
                remote_host=d.host,
                remote_port=d.port,
            )
        out["kv_transfer_params"] = kv
        return out

    def decode(self, body, p, rank, d, tid, kv):
        out = dict(body)
        # Prefill already produced the first token.
        for name in ("max_tokens", "max_completion_tokens"):
            v = out.get(name)
            if _is_int(v):
                out[name] = max(1, v - 1)
        params: dict[str, Any] = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "transfer_id": tid,
            "remote_dp_size": p.dp_size,
            "remote_tp_size": p.tp_size,
        }
        if p.dp_size > 1:
            params["remote_dp_rank"] = rank
        if self._gen1(p, d):
            params.update(
                remote_handshake_port=p.handshake_port,
                remote_notify_port=p.notify_port,
                remote_host=p.host,
                remote_port=p.port,
            )
        if self.mode == "read":
            if self.missing_kv(kv):
                return out  # nothing to pull: decode recomputes the prompt (counted and logged)
            assert kv is not None
            # Decode pulls from where the KV sits. vLLM's prefill answers with the params its
            # decode needs (engine, blocks, the DP rank it ran on and its pod-local DP size,
            # addresses), to be forwarded as they are (MoRIIOConnectorScheduler.request_finished);
            # the proxy's own fields stay for what a prefill leaves out.
            params.update((k, v) for k, v in kv.items() if v is not None)
        out["kv_transfer_params"] = params
        return out

    def missing_kv(self, kv: dict | None) -> bool:
        return self.mode == "read" and not (kv and kv.get("remote_block_ids") is not None)


class MooncakeFlow(Flow):
    """Mooncake: shared transfer id, decode pulls from the prefill's bootstrap server."""

    concurrent = True

    def transfer_id(self, rid: str) -> str:
        return f"xfer-{rid}"

    def prefill(self, body, p, rank, d, tid):
        out = _prefill_base(body)
        out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
        return out

    def decode(self, body, p, rank, d, tid, kv):
        out = dict(body)
        out["kv_transfer_params"] = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_bootstrap_addr": p.bootstrap_addr,
            "remote_engine_id": p.engine_ids.get(rank),
            "transfer_id": tid,
        }
        return out


# Flow names (a connector entry's ProxyUse.flow) -> the classes that shape its legs.
FLOWS: dict[str, type[Flow]] = {
    "none": Flow,  # no legs to shape: the proxy forwards whole requests (Proxy._forward)
    "two_phase": TwoPhaseFlow,
    "pdbench": PdbenchFlow,
    "moriio": MoriioFlow,
    "mooncake": MooncakeFlow,
}


def make_flow(connector: str, moriio_mode: str | None = None, overlap: bool = False) -> Flow:
    """The flow of a connector of the table (harness.kv_connectors), with the proxy's settings."""
    name = kv_connectors.get(connector).proxy.flow
    try:
        flow = FLOWS[name]
    except KeyError:
        raise ValueError(f"connector {connector!r} names flow {name!r}; known flows: {', '.join(FLOWS)}") from None
    return flow.configured(moriio_mode, overlap)
