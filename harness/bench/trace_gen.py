"""Generate a Mooncake-format trace of multi-turn sessions whose prompts share blocks.

Each session starts at a Poisson arrival (`rate` sessions per second) and sends `turns` requests,
`think_s` apart on average (exponential gaps). Turn 1's prompt is the shared blocks every session
starts with (a system prompt) and `first_blocks` of its own; each later turn re-sends the previous
turn's blocks and adds `new_blocks` more, as a conversation whose history is re-sent. Hash ids are
numbered session by session, so equal ids are equal blocks exactly where prompts share them.
Seeded: the same settings give the same trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from harness import atomic, exit_codes
from harness.strict import FrozenStrict


class TraceGenSettings(FrozenStrict):
    sessions: PositiveInt = 20
    turns: PositiveInt = 3
    rate: PositiveFloat = 2.0  # sessions started per second
    think_s: NonNegativeFloat = 1.0  # mean gap between a session's turns
    shared_blocks: NonNegativeInt = 1  # blocks every session's prompts start with
    first_blocks: PositiveInt = 2  # a session's own blocks in its first turn
    new_blocks: PositiveInt = 1  # blocks each later turn adds
    output_length: PositiveInt = 64
    block_tokens: PositiveInt = 512
    seed: int = 0


def generate(settings: TraceGenSettings) -> list[dict[str, Any]]:
    """The trace's records in time order (ties in session order), as Mooncake writes them."""
    import numpy as np  # here: the CLI registers this command in every pdbench process

    s = settings
    rng = np.random.default_rng(s.seed)
    starts = np.cumsum(rng.exponential(1.0 / s.rate, size=s.sessions))
    starts -= starts[0]  # the first session starts the trace
    shared = list(range(s.shared_blocks))
    next_id = s.shared_blocks
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for k, t in enumerate(starts.tolist()):
        ids = shared + list(range(next_id, next_id + s.first_blocks))
        next_id += s.first_blocks
        for turn in range(s.turns):
            if turn:
                t += float(rng.exponential(s.think_s)) if s.think_s > 0 else 0.0
                ids = ids + list(range(next_id, next_id + s.new_blocks))
                next_id += s.new_blocks
            record = {
                "timestamp": 0,
                "input_length": len(ids) * s.block_tokens,
                "output_length": s.output_length,
                "hash_ids": ids,
            }
            rows.append((t, k, record))
    rows.sort(key=lambda r: (r[0], r[1]))
    for t, _, record in rows:
        record["timestamp"] = round(t * 1000.0)
    return [r for _, _, r in rows]


def write_trace(path: Path, settings: TraceGenSettings) -> int:
    """Write the generated trace as JSONL (atomically; an existing file is kept); its request count."""
    records = generate(settings)
    atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in records), replace=False)
    return len(records)


def trace_generate_command(
    out: Annotated[Path, typer.Argument(metavar="FILE", help="Trace to write (JSONL); an existing file is kept.")],
    sessions: Annotated[int, typer.Option("--sessions", help="Sessions in the trace.")] = 20,
    turns: Annotated[int, typer.Option("--turns", help="Requests per session.")] = 3,
    rate: Annotated[float, typer.Option("--rate", help="Sessions started per second (Poisson).")] = 2.0,
    think_s: Annotated[float, typer.Option("--think-s", help="Mean gap between a session's turns, s.")] = 1.0,
    shared_blocks: Annotated[int, typer.Option("--shared-blocks", help="Blocks every session starts with.")] = 1,
    first_blocks: Annotated[int, typer.Option("--first-blocks", help="A session's own blocks in turn 1.")] = 2,
    new_blocks: Annotated[int, typer.Option("--new-blocks", help="Blocks each later turn adds.")] = 1,
    output_length: Annotated[int, typer.Option("--output-length", help="Output tokens per request.")] = 64,
    block_tokens: Annotated[int, typer.Option("--block-tokens", help="Tokens per block (Mooncake: 512).")] = 512,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
) -> None:
    """Generate a Mooncake-format trace of multi-turn sessions that share prompt blocks."""
    from pydantic import ValidationError

    try:
        settings = TraceGenSettings(
            sessions=sessions,
            turns=turns,
            rate=rate,
            think_s=think_s,
            shared_blocks=shared_blocks,
            first_blocks=first_blocks,
            new_blocks=new_blocks,
            output_length=output_length,
            block_tokens=block_tokens,
            seed=seed,
        )
    except ValidationError as e:
        err = e.errors()[0]
        typer.echo(f"Error: --{str(err['loc'][0]).replace('_', '-')}: {err['msg']}", err=True)
        raise typer.Exit(code=exit_codes.USAGE) from None
    try:
        n = write_trace(out, settings)
    except FileExistsError:
        typer.echo(f"Error: {out} exists; pdbench never overwrites a trace", err=True)
        raise typer.Exit(code=exit_codes.USAGE) from None
    typer.echo(f"wrote {n} requests to {out}")
