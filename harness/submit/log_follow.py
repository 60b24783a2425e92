"""`pdbench logs --follow`: the end of each selected log, then its new lines as they come, until the job ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from harness import exit_codes
from harness.launch.find import NoJob, job_of
from harness.launch.job import JobState, LaunchError
from harness.rundir import RunDir
from harness.submit.refused import Refused

POLL_S = 0.5
# How often the launcher is asked for the job's state (sacct on Slurm): the logs are read more often.
STATE_EVERY_S = 5.0


class _Tail:
    """Prints whole lines only, under a `==> name <==` header whenever the log changes (as `tail -f`)."""

    def __init__(self, run: RunDir, out: TextIO):
        self.run = run
        self.out = out
        self.offsets: dict[Path, int] = {}
        self.last: Path | None = None

    def _print(self, path: Path, text: str) -> None:
        if path != self.last:
            self.out.write(f"==> {self.run.relative(path)} <==\n")
            self.last = path
        self.out.write(text)
        self.out.flush()

    def start(self, path: Path, lines: int) -> None:
        """The last `lines` whole lines (0: all) of a log there before following began."""
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        self.offsets[path] = cut
        kept = data[:cut].decode(errors="replace").splitlines(keepends=True)
        self._print(path, "".join(kept[-lines:] if lines else kept))

    def pump(self, paths: list[Path]) -> None:
        for path in paths:
            offset = self.offsets.get(path, 0)  # a log that appeared while following: from its start
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            cut = data.rfind(b"\n") + 1
            if cut:
                self._print(path, data[:cut].decode(errors="replace"))
            self.offsets[path] = offset + cut


def follow_logs(run: RunDir, node: int | None, role: str | None, lines: int, out: TextIO) -> int:
    """Until the run's job ends (0), or Ctrl-C (130). A run never launched has nothing to follow (Refused, 1)."""
    try:
        job = job_of(run)
    except NoJob:
        raise Refused(f"{run.path}: never launched: it has no logs to follow", code=1) from None
    tail = _Tail(run, out)
    for path in run.log_files(node, role):
        tail.start(path, lines)
    next_state = 0.0
    try:
        while True:
            if time.monotonic() >= next_state:
                try:
                    state = job.info().state
                except LaunchError as e:
                    raise Refused(f"{job.title}: state unavailable ({e})", code=1) from None
                next_state = time.monotonic() + STATE_EVERY_S
                if state.finished or state is JobState.UNKNOWN:
                    tail.pump(run.log_files(node, role))  # what the job wrote up to its end
                    out.write(f"--- {job.title} ended: {state.value}\n")
                    out.flush()
                    return 0
            tail.pump(run.log_files(node, role))
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
