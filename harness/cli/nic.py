"""`pdbench nic`: this node's RDMA NICs and the transport environment (harness.node.nic_cli)."""

from __future__ import annotations

from harness.cli.root import command
from harness.node.nic_cli import nic_command

command("nic", "pdbench nic --json", help="Detect RDMA NICs and print the UCX/NCCL/NIXL environment for this node.")(
    nic_command
)
