"""The rule `outputs_match`: did the deployment answer a point's sentinel prompts as a path that
does not disaggregate answered them? The client (harness.bench.sentinels) sends the prompts and
compares; this module judges the comparison like every other rule, so a wrong answer makes the
point invalid whatever its /metrics show."""

from __future__ import annotations

from pydantic import BaseModel

from harness.validity.rules import PointValidity, RuleResult

RULE = "outputs_match"


class Divergence(BaseModel):
    """One sentinel whose answer parted from the reference beyond the tolerance."""

    sentinel: int  # its index in the point, in send order
    position: int  # the first differing token (or character, without token ids)
    unit: str  # "token" or "character"
    prompt: str  # the prompt's start, for the reason
    reference: str  # both continuations from a little before the divergence
    answer: str


class OutputsCheck(BaseModel):
    sent: int
    answered: int  # sentinels whose request succeeded
    compared: int  # answered and with a reference answer
    exact: int  # compared and equal in every token
    matched: int  # compared and equal within the tolerance
    match_tokens: int | None  # the tolerance: the first N tokens must match; None: all
    max_diverged: int
    diverged: list[Divergence] = []
    why_not_compared: str | None = None  # when nothing could be compared


def rule(check: OutputsCheck) -> RuleResult:
    if check.compared == 0:
        why = check.why_not_compared or f"none of {check.sent} sentinel(s) was answered"
        return RuleResult(name=RULE, status="not_checked", threshold=None, detail=why)
    bad = check.compared - check.matched
    rate = check.matched / check.compared
    need = (check.compared - check.max_diverged) / check.compared
    within = "every token" if check.match_tokens is None else f"the first {check.match_tokens} tokens"
    detail = (
        f"{check.matched} of {check.compared} sentinel(s) matched the reference in {within} "
        f"({check.exact} exactly; at most {check.max_diverged} may diverge)"
    )
    if check.diverged:
        d = check.diverged[0]
        detail += (
            f"; sentinel {d.sentinel} (prompt {d.prompt!r}) first differs at {d.unit} {d.position}: "
            f"reference {d.reference!r}, answer {d.answer!r}"
        )
    return RuleResult(
        name=RULE,
        status="failed" if bad > check.max_diverged else "passed",
        measured=rate,
        threshold=need,
        detail=detail,
    )


def with_outputs_check(verdict: PointValidity, check: OutputsCheck | None) -> PointValidity:
    """The point's verdict with outputs_match added: a failure makes it invalid (its reason first);
    a pass or a not-checked rule leaves the verdict as the /metrics rules made it."""
    if check is None:
        return verdict
    r = rule(check)
    if r.status != "failed":
        return verdict.model_copy(update={"rules": [*verdict.rules, r]})
    return verdict.model_copy(
        update={
            "verdict": "invalid",
            "valid": False,
            "reasons": [f"{r.name}: {r.detail}", *(verdict.reasons if verdict.verdict == "invalid" else [])],
            "rules": [*verdict.rules, r],
        }
    )
