"""A result's `schedule` section: how closely a trace replay's requests left at the trace's times.

Written by the bench client (harness.bench.trace.schedule_section), read by report; this model is
the one definition of the format, so a reader's error names the field.

Lateness is a request's send time minus its scheduled time (the trace's timestamp over `speed`,
from the batch's start). A request that found all `cap` slots busy at its scheduled time waited
for one: that wait is the cap's, not the client's, so `client_lateness_ms` counts only the requests
a free slot was waiting for (the client's own timing error), and `lateness_ms` all sent requests.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, PositiveFloat, model_validator


class Lateness(BaseModel):
    model_config = ConfigDict(frozen=True)
    p50: NonNegativeFloat  # ms
    p99: NonNegativeFloat
    max: NonNegativeFloat

    @model_validator(mode="after")
    def _ordered(self) -> Lateness:
        if not self.p50 <= self.p99 <= self.max:
            raise ValueError(f"need p50 <= p99 <= max, got {self.p50}, {self.p99}, {self.max}")
        return self


class ScheduleSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    requests: NonNegativeInt  # replayed at this point (the trace, or its first max_requests)
    sent: NonNegativeInt  # of them, sent (a stopped batch leaves some unsent)
    speed: PositiveFloat  # time factor: 2.0 replays the trace twice as fast
    span_s: NonNegativeFloat  # scheduled time of the last request, after speed
    cap: NonNegativeInt  # requests in flight at most (the point's concurrency)
    in_flight_max: NonNegativeInt  # most requests in flight at once, measured
    cap_delayed: NonNegativeInt  # requests that found every slot busy at their scheduled time
    lateness_ms: Lateness | None  # every sent request; None when none was sent
    client_lateness_ms: Lateness | None  # requests a free slot waited for; None when there were none

    @model_validator(mode="after")
    def _counts_add_up(self) -> ScheduleSummary:
        if not self.cap_delayed <= self.sent <= self.requests:
            raise ValueError(
                f"counts do not add up: need cap_delayed <= sent <= requests, got {self.cap_delayed}, "
                f"{self.sent}, {self.requests}"
            )
        if self.in_flight_max > self.cap:
            raise ValueError(f"in_flight_max {self.in_flight_max} exceeds the cap {self.cap}")
        if (self.lateness_ms is None) != (self.sent == 0):
            raise ValueError("lateness_ms is given exactly when a request was sent")
        if (self.client_lateness_ms is None) != (self.sent == self.cap_delayed):
            raise ValueError("client_lateness_ms is given exactly when a sent request was not cap-delayed")
        return self

    @property
    def capped(self) -> bool:
        """Whether the in-flight cap delayed any request."""
        return self.cap_delayed > 0
