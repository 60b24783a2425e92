"""`pdbench bench`: the benchmark client; its options come from ClientConfig (harness.bench.bench_command)."""

from __future__ import annotations

from harness.bench.bench_command import bench_command
from harness.cli.root import command

command(
    "bench",
    "pdbench bench --base-url http://127.0.0.1:30000 --model M --tokenizer T \\",
    "    --isl 1024 --osl 128 --concurrency 1,4,16 --results-dir out/",
    help="Benchmark an OpenAI-compatible endpoint over a concurrency sweep.",
)(bench_command)
