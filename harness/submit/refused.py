"""Refused: why a pipeline stops, and the exit code the CLI gives it (imports nothing, so the CLI
can catch it without loading the pipeline)."""

from __future__ import annotations

EXIT_CONFIG = 2  # a recipe, option or run reference that cannot be used


class Refused(Exception):
    def __init__(self, message: str, code: int = EXIT_CONFIG):
        super().__init__(message)
        self.code = code
