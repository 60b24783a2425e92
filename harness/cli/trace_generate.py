"""`pdbench trace-generate`: a synthetic multi-turn trace (harness.bench.trace_gen)."""

from __future__ import annotations

from harness.bench.trace_gen import trace_generate_command
from harness.cli.root import command

command(
    "trace-generate",
    "pdbench trace-generate sessions.jsonl --sessions 50 --turns 4 --rate 2 --block-tokens 512",
    help="Generate a Mooncake-format trace of multi-turn sessions that share prompt blocks.",
)(trace_generate_command)
