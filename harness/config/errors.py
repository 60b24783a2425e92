"""ConfigError: bad configuration, naming the file (or option), the key and what was expected."""

from __future__ import annotations

from pathlib import Path


class ConfigError(Exception):
    """Bad configuration; the CLI prints it and exits with code 2."""

    def __init__(self, file: Path | str, key: str, expected: str):
        self.file, self.key, self.expected = str(file), key, expected
        # `--set KEY` already names the key.
        where = f"{self.file}: {key}: " if key and self.file != f"--set {key}" else f"{self.file}: "
        super().__init__(where + expected)
