"""Echo new lines of a run's log files to the terminal, so a run shows progress as it goes."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from harness.rundir import RunDir


class LogTail:
    def __init__(self, paths: list[Path], out: TextIO):
        self.offsets = {p: 0 for p in paths}
        self.out = out

    @classmethod
    def progress(cls, run: RunDir, out: TextIO) -> LogTail:
        """The head node's log and the benchmark client's: the job's progress, point by point."""
        return cls([run.log("node0"), run.log("bench")], out)

    def pump(self) -> None:
        for path, offset in self.offsets.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            cut = data.rfind(b"\n") + 1
            if cut:
                self.out.write(data[:cut].decode(errors="replace"))
                self.out.flush()
                self.offsets[path] = offset + cut
