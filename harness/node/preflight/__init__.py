"""Checks every node of a job runs before it starts any server (and `pdbench doctor` runs).

A job on a GPU cluster that dies 20 minutes in, after loading a model, because a port was
taken, a GPU held by an orphaned container or a weight shard missing costs hours; these
checks find such faults in seconds. Each check returns a list of problem strings (empty:
fine) that name the cause and say what to do. None of them can hang: every external tool
runs with a timeout (and a tool that times out or fails is itself a problem), and
run_checks bounds each check again. Which checks apply to a node is decided in
harness.node.node_checks. One module per resource; this package exports the checks and
the runner.
"""

from __future__ import annotations

from harness.node.preflight.clock import check_clock
from harness.node.preflight.disk import check_disk
from harness.node.preflight.gpus import check_gpus
from harness.node.preflight.memory import check_memory
from harness.node.preflight.nsys import check_nsys
from harness.node.preflight.ports import check_ports
from harness.node.preflight.rdma import check_rdma
from harness.node.preflight.runner import Problem, run_checks
from harness.node.preflight.weights import check_weights

__all__ = [
    "Problem",
    "check_clock",
    "check_disk",
    "check_gpus",
    "check_memory",
    "check_nsys",
    "check_ports",
    "check_rdma",
    "check_weights",
    "run_checks",
]
