"""The exit codes of every pdbench command and process, in one place (imports nothing, so any
floor and the CLI's first lines can use them)."""

from __future__ import annotations

FAILED = 1  # the work ran and did not succeed (a request, a point, a job failed)
USAGE = 2  # a recipe, configuration, option or run reference that cannot be used (Click's usage error too)
TIMED_OUT = 124  # a time limit ended it (the code `timeout` gives)
INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
