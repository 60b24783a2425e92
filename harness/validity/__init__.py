from harness.validity.rules import (  # noqa: F401
    ClientCounts,
    PointValidity,
    ServerScrapes,
    ValidityThresholds,
    evaluate,
    gauge_peaks,
    unverified,
)
