"""`pdbench mock-engine`: the mock OpenAI-compatible engine (harness.mock_engine.engine_command)."""

from __future__ import annotations

from harness.cli.root import command
from harness.mock_engine.engine_command import mock_engine_command

command(
    "mock-engine",
    "pdbench mock-engine --port 8000 --ttft-ms 50 --itl-ms 10",
    help="Run a mock OpenAI-compatible engine (tests, benchmarks, plumbing checks).",
)(mock_engine_command)
