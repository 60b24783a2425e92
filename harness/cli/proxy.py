"""`pdbench proxy`: the PD proxy; its options come from ProxyConfig (harness.proxy.proxy_command)."""

from __future__ import annotations

from harness.cli.root import command
from harness.proxy.proxy_command import proxy_command

command(
    "proxy",
    "pdbench proxy --prefill http://p0:8100 --decode http://d0:8200 --decode http://d1:8200",
    help="Run the PD proxy (prefill then decode, streamed back).",
)(proxy_command)
