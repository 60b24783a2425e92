"""An RDMA device with an ACTIVE port, for a connector that moves KV over RDMA."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.node import nic


def check_rdma(sysfs: Path = Path("/sys"), environ: Mapping[str, str] | None = None) -> list[str]:
    """The connector moves KV over RDMA: the node needs an RDMA device with an ACTIVE port
    (among IBDEVICES, when set)."""
    environ = os.environ if environ is None else environ
    present = nic.list_devices(sysfs)
    if not present:
        return [
            f"no RDMA device under {sysfs / 'class' / 'infiniband'}; the connector needs RDMA "
            "(set topology.nic_detection=false to use TCP)"
        ]
    try:
        result = nic.detect(sysfs, environ, runner=_no_runner)
    except nic.NicError as e:
        return [f"{e} (set IBDEVICES to devices of this node, or unset it to use every active one)"]
    if result.transport == "rdma":
        return []
    states = []
    for name in present:
        dev = nic.read_device(sysfs, name)
        states += [f"{name} port {p.port} is {p.state}" for p in dev.ports] or [f"{name} has no ports"]
    return [
        f"no RDMA port is ACTIVE ({', '.join(states)}); the connector needs RDMA: check the links "
        "(ibstat / ibv_devinfo: cable, switch port, subnet manager), or set topology.nic_detection=false to use TCP"
    ]


def _no_runner(argv: Sequence[str], timeout: float) -> str:
    raise OSError("not run by the preflight")  # QoS is not checked here; nic.detect makes it a notice
