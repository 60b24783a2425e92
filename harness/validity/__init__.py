from harness.validity.rules import (  # noqa: F401
    ClientCounts,
    PointValidity,
    ServerScrapes,
    ValidityThresholds,
    early_reason,
    evaluate,
    gauge_peaks,
    receives_behind,
    stopped_early,
    unverified,
)
