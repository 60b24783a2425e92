"""Refused: why a pipeline stops, and the exit code the CLI gives it (imports nothing, so the CLI
can catch it without loading the pipeline)."""

from __future__ import annotations

from harness import exit_codes


class Refused(Exception):
    def __init__(self, message: str, code: int = exit_codes.USAGE):
        super().__init__(message)
        self.code = code
