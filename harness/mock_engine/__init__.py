"""`pdbench mock-engine`: a fast OpenAI-compatible server that imitates one vLLM instance.

For tests, for benchmarks (it is the target of the client's capacity benchmark) and
for users who want to check a cluster's plumbing (proxy, ports, health gates) without
GPUs. It is never a default target of anything.

Public API (kept stable; other components and benchmarks build on it):

    from harness.mock_engine import MockEngineConfig, build_app, serve
    cfg = MockEngineConfig(port=8100, model="tiny", ttft_ms=50, itl_ms="normal:10,1", role="prefill")
    app = build_app(cfg)   # an aiohttp web.Application: run it in-process with web.AppRunner
    serve(cfg)             # or block here until SIGINT/SIGTERM (uvloop when importable)
    # harness.mock_engine.engine_command.mock_engine_command: the Typer command behind `pdbench mock-engine`

Endpoints: POST /v1/completions and /v1/chat/completions (streaming and not),
GET /v1/models, /health (200) and /metrics (Prometheus text with vLLM's names:
vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:prefix_cache_queries_total,
vllm:prefix_cache_hits_total, vllm:external_prefix_cache_queries_total,
vllm:external_prefix_cache_hits_total, vllm:request_success_total{finished_reason},
vllm:num_requests_running, vllm:num_requests_waiting; labels engine="0",model_name), and
GET /mock/emissions for client benchmarks: how late the engine's own writes left (first
tokens, later tokens) and, with ?requests=1, each finished stream that carried X-Request-Id
or X-Pdbench-Id (arrival, first and last token write, tokens); ?reset=1 starts anew.

Behaviour:
- Latency: the first token is sent `ttft_ms` after the request arrives, then one token
  every `itl_ms`. serve() counts from the arrival of the request's first bytes on the
  socket; an app from build_app() run in your own AppRunner counts from its handler's
  start (aiohttp starts handlers a couple of event-loop iterations later). Both are distributions, `KIND[:A[,B]]` in milliseconds: `50` or
  `constant:50`, `normal:MEAN,STD` (clipped at 0), `exponential:MEAN`,
  `uniform:LOW,HIGH`, `lognormal:MEAN,STD`. Each token has an absolute deadline, so
  timer errors never accumulate along a stream; the event loop's timer bias is learnt
  and corrected online. Tokens are written from loop timer callbacks straight to the
  transport (framed as the HTTP chunks aiohttp would send), and tokens already due go
  in one write. With both at zero a whole stream is one pre-encoded write (the
  capacity benchmark's setting).
- Tokens: the output cycles through fixed one-word tokens (" the", " quick", ...).
  Prompt tokens are counted as whitespace-separated words (at least 1; a prompt of
  token ids counts its ids; chat counts the words of every message's content), or
  exactly with `tokenizer` (a HF tokenizer path; chat then uses its chat template).
- Length: `max_tokens` (chat: `max_completion_tokens` first) tokens, default 16. The mock
  emits EOS after `eos_after` tokens (finish_reason "stop") unless `ignore_eos` is true;
  with `eos_after` unset it never does. With `max_model_len`, prompt + max_tokens above
  it is HTTP 400, as vLLM. A wrong `model` is HTTP 404, as vLLM.
- Queueing: with `max_num_seqs` at most that many requests are served at once; the rest wait
  in arrival order and their TTFT and token times count from admission.
- Streaming: vLLM-shaped SSE chunks (`text_completion` / `chat.completion.chunk`; chat
  opens with a role chunk), the finish reason on the last token's chunk, a usage chunk
  (`choices: []`) when `stream_options.include_usage`, then `data: [DONE]`.
- KV transfer, as vLLM's NIXL connector: a request whose `kv_transfer_params` has
  `do_remote_decode` (the prefill leg) answers with `kv_transfer_params` =
  {do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [[...]] (one
  block per `block_size` prompt tokens), remote_engine_id: `engine_id`,
  remote_request_id, remote_host: `kv_host`, remote_port: `kv_port`, tp_size: 1,
  remote_num_tokens} in its non-streamed response. A request with `do_remote_prefill`
  and those fields (the decode leg) counts its prompt tokens as external prefix-cache
  hits and sends its first token after one `itl_ms` instead of `ttft_ms` (no prefill
  here); without the fields it recomputes, like vLLM, with no hits. `role` "prefill"
  rejects decode legs and "decode" rejects prefill legs with HTTP 400 (stricter than
  vLLM, to catch a misrouting proxy); "both" serves everything. Plain requests are
  served by every role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.mock_engine.settings import Distribution, MockEngineConfig

if TYPE_CHECKING:
    from harness.mock_engine.server import build_app, serve

__all__ = ["Distribution", "MockEngineConfig", "build_app", "serve"]


def __getattr__(name: str) -> Any:
    # The aiohttp server on first use, not when the CLI registers `pdbench mock-engine`.
    if name in ("build_app", "serve"):
        from harness.mock_engine import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
