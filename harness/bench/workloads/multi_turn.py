"""dataset `sessions`: multi-turn conversations (harness.bench.sessions), `concurrency` of them in
flight, each turn built from the answer before it; sent in this process only, as a turn's
prompt cannot be built before the answer it continues has come."""

from __future__ import annotations

from typing import Any

from harness.bench.client_config import ClientConfig
from harness.bench.scope import WARMUP
from harness.bench.sessions import SessionSpec, describe, plan_sessions, session_summary
from harness.bench.workloads.base import Seeds, Sent, SessionWindow, Window
from harness.bench.workloads.random_prompts import RandomPrompts
from harness.validity.outputs import OutputsCheck


class MultiTurn(RandomPrompts):
    """Its sample (the sentinels beside the sessions) is independent prompts of the first turn's shape."""

    in_workers = False

    def describe(self, cfg: ClientConfig, concurrency: int) -> str:
        sess = cfg.sessions
        assert sess is not None
        return describe(sess, sess.sessions_for(concurrency), sess.warmup_sessions_for(concurrency))

    def warmups(self, cfg: ClientConfig, concurrency: int, seeds: Seeds) -> Window:
        assert cfg.sessions is not None
        return SessionWindow(self._plan(cfg, cfg.sessions.warmup_sessions_for(concurrency), seeds(WARMUP)))

    def window(self, cfg: ClientConfig, concurrency: int, seeds: Seeds, stream: int) -> Window:
        assert cfg.sessions is not None
        return SessionWindow(self._plan(cfg, cfg.sessions.sessions_for(concurrency), seeds(stream)))

    def _plan(self, cfg: ClientConfig, count: int, rng: Any) -> list[SessionSpec]:
        """`count` sessions, drawn from the point's seed sub-stream (before the clock starts)."""
        assert cfg.isl is not None and cfg.osl is not None and cfg.sessions is not None
        return plan_sessions(
            self._tokenizer(),
            count,
            cfg.isl,
            cfg.osl,
            cfg.sessions,
            cfg.range_ratio,
            cfg.range_ratio_convention,
            rng,
            prefix=self.prefix,
            prefix_len=cfg.random_prefix_len,
        )

    def sections(
        self, cfg: ClientConfig, concurrency: int, sent: Sent, check: OutputsCheck | None, sentinels_sent: bool
    ) -> dict[str, Any]:
        if sent.sessions is None or cfg.sessions is None:
            return {}
        note = _sentinels_beside(cfg, check, sentinels_sent)
        return {"sessions": session_summary(sent.sessions, cfg.sessions, note).model_dump(mode="json")}


def _sentinels_beside(cfg: ClientConfig, check: OutputsCheck | None, sent: bool) -> str:
    """The sessions section's word on the sentinels: independent prompts of the first turn's
    shape go beside the sessions, or why none did."""
    if check is None:
        return "none: sentinels.enabled is false"
    if not sent:
        return f"none sent: {check.why_not_compared}"
    return (
        f"{check.sent} independent greedy prompts of {cfg.isl}/{cfg.osl} tokens went beside the "
        "sessions (validity rule outputs_match)"
    )
