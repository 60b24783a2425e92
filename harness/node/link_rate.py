"""The line rate of the network interface the KV leaves by, from sysfs: the bound half of the KV
ceiling across hosts (harness.node.kv_ceiling; the measured half: harness.node.kv_stream).

The interface is the one that carries this node's address on the connection to decode-0's node
(the measured transfer's own source address), so it is the route's choice, not a guess. Its
`/sys/class/net/<if>/speed` (Mb/s) is a line rate only for a device (or a bond): a virtual interface (veth,
bridge, lo) has none, or a nominal one (veth says 10000 whatever it moves), and -1 means the
driver does not know (virtio). sysfs also shows the network namespace that mounted it: a process
that only entered another one (`nsenter --net`, as the CPU Slurm cluster's nodes do) reads the
host's interface of the same name there; the interface's hardware address, asked of the kernel in
this namespace, tells them apart. What is not a line rate is recorded as none, saying why.
Where the NIC detection gave the KV's servers RDMA ports (UCX_NET_DEVICES), the KV crosses those,
not the route's interface: their rate is the line rate (`rdma_line_rate`).
"""

from __future__ import annotations

import fcntl
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from harness.node.coordination import interface_address

SYSFS = Path("/sys")
SIOCGIFHWADDR = 0x8927


@dataclass(frozen=True)
class LineRate:
    interface: str | None
    gbps: float | None  # GB/s (bytes); None when sysfs gives no line rate for it
    note: str  # what sysfs said, e.g. "100000 Mb/s" or why there is none


def rdma_line_rate(net_devices: str | None, sysfs: Path | None = None) -> LineRate | None:
    """The line rate of the RDMA ports the NIC detection gave a server's UCX (its UCX_NET_DEVICES,
    e.g. "mlx5_0:1,mlx5_1:1", harness.node.nic): the sum of each port's `rate` in sysfs ("400
    Gb/sec (4X NDR)"), what UCX may stripe one transfer over at most. None when the value names no
    RDMA port here (TCP: an interface name, or unset); a port without a readable rate gives none."""
    ib = (sysfs or SYSFS) / "class" / "infiniband"
    named = [d.strip().partition(":") for d in (net_devices or "").split(",")]
    ports = [(dev, port) for dev, sep, port in named if sep and (ib / dev).is_dir()]
    if not ports:
        return None
    names = ",".join(f"{dev}:{port}" for dev, port in ports)
    said, total = [], 0.0
    for dev, port in ports:
        raw = _read(ib / dev / "ports" / port / "rate")
        m = re.match(r"\s*([\d.]+)\s*Gb/sec", raw or "")
        if m is None:
            return LineRate(names, None, f"{ib / dev / 'ports' / port / 'rate'} reads {raw!r}, not a rate in Gb/sec")
        total += float(m.group(1))
        said.append(f"{dev}:{port} {raw}")
    return LineRate(names, total / 8, f"UCX_NET_DEVICES of prefill-0: {', '.join(said)}")


def interface_of(addr: str) -> str | None:
    """The interface (of this network namespace) that holds IPv4 address `addr`."""
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == addr:
                return name
        except OSError:
            continue
    return None


def hardware_address(name: str) -> str | None:
    """`name`'s hardware address in this process's network namespace (SIOCGIFHWADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            out = fcntl.ioctl(s.fileno(), SIOCGIFHWADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return ":".join(f"{b:02x}" for b in out[18:24])


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):  # EINVAL: the driver has no speed (lo, a down link)
        return None


def line_rate(interface: str | None, sysfs: Path | None = None, hwaddr: str | None = None) -> LineRate:
    """What sysfs says of `interface`'s line rate. `hwaddr`: its hardware address as this
    namespace's kernel gives it (looked up when None)."""
    if interface is None:
        return LineRate(None, None, "no interface of this node holds the transfer's source address")
    d = (sysfs or SYSFS) / "class" / "net" / interface
    if not d.is_dir():
        return LineRate(interface, None, f"{d} does not exist")
    own = hwaddr if hwaddr is not None else hardware_address(interface)
    seen = _read(d / "address")
    if own and seen and own.lower() != seen.lower():
        return LineRate(
            interface,
            None,
            f"sysfs shows another network namespace's {interface} (address {seen}, not this node's {own})",
        )
    speed = _read(d / "speed")
    # A bond has no device of its own but a real speed: the sum of its links'.
    virtual = not (d / "device").exists() and not (d / "bonding").is_dir()
    kind = "a virtual interface (no device)" if virtual else "a device"
    if speed is None:
        return LineRate(interface, None, f"{interface} is {kind} with no speed in sysfs")
    try:
        mbps = int(speed)
    except ValueError:
        return LineRate(interface, None, f"{d / 'speed'} reads {speed!r}, not Mb/s")
    if mbps <= 0:
        return LineRate(interface, None, f"{interface} is {kind} whose speed is unknown ({mbps})")
    if virtual:
        return LineRate(interface, None, f"{interface} is {kind}: its speed {mbps} Mb/s is nominal, not a line rate")
    return LineRate(interface, mbps * 1e6 / 8 / 1e9, f"{mbps} Mb/s")
