"""RDMA NIC detection for one node: which devices/ports to use, and the env that says so.

Everything reads a sysfs root and an environment mapping passed in, so tests can build a
fake `/sys` in a temporary directory. The result is a set of environment variables for
UCX (NIXL's transport), NCCL and vLLM's NIXL side channel, plus human-readable notices.

QoS (traffic class / service level) comes from PDBENCH_IB_TRAFFIC_CLASS / PDBENCH_IB_SL
first, then from AMD Pensando's `nicctl show qos` when that tool is on PATH. The nicctl
parsing is best effort: its text output is not a stable interface, so anything we cannot
read leaves QoS unset (the libraries' defaults) with a notice rather than failing.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SYSFS = Path("/sys")
PROC_NET_ROUTE = Path("/proc/net/route")
NICCTL_TIMEOUT_S = 5.0

# Prefix -> vendor. Order matters only in that prefixes do not overlap.
VENDOR_PREFIXES: tuple[tuple[str, str], ...] = (
    ("mlx5_", "nvidia"),  # NVIDIA / Mellanox ConnectX
    ("ionic_", "amd"),  # AMD Pensando (Pollara / AI NIC)
    ("bnxt_re", "broadcom"),  # Broadcom NetXtreme-E
    ("rdma", "generic"),  # renamed devices (udev rules), vendor unknown from the name
)

# A command runner: (argv, timeout seconds) -> stdout. Raises OSError or
# subprocess.SubprocessError (incl. TimeoutExpired) on failure. Injected by tests.
Runner = Callable[[Sequence[str], float], str]


class NicError(ValueError):
    """A configuration the user asked for cannot be honoured (e.g. IBDEVICES names a missing device)."""


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", ...
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    gid_index: int | None
    gid: str | None
    ipv4: str | None  # from an IPv4-mapped RoCE v2 GID
    netdev: str | None

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def is_roce(self) -> bool:
        return self.link_layer.lower() == "ethernet"


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    vendor: str
    ports: tuple[RdmaPort, ...]


@dataclass
class NicEnv:
    env: dict[str, str] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    transport: str = "tcp"  # "rdma" or "tcp"

    def to_json(self) -> dict[str, object]:
        return {"transport": self.transport, "env": dict(self.env), "notices": list(self.notices)}


# --------------------------------------------------------------------------- sysfs


def vendor_of(name: str) -> str:
    for prefix, vendor in VENDOR_PREFIXES:
        if name.startswith(prefix):
            return vendor
    return "unknown"


def _natural_key(name: str) -> list[object]:
    # mlx5_2 before mlx5_10, as ibv_devices lists them.
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _read(path: Path) -> str | None:
    # Real sysfs answers EINVAL for unpopulated GID attribute slots; treat as absent.
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _numeric_entries(d: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())
    except OSError:
        return []


def list_devices(sysfs: Path = SYSFS) -> list[str]:
    root = sysfs / "class" / "infiniband"
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir()), key=_natural_key)


def ipv4_from_gid(gid: str) -> str | None:
    """'0000:0000:0000:0000:0000:ffff:0a00:0001' -> '10.0.0.1'; None for anything else."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


def _is_zero_gid(gid: str | None) -> bool:
    try:
        return gid is None or ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(0)
    except ValueError:
        return True


def select_gid(port_dir: Path, link_layer: str) -> tuple[int | None, str | None]:
    """The GID index (and GID) UCX/NCCL should use on this port."""
    if link_layer.lower() != "ethernet":
        # InfiniBand: index 0 is the port GID (subnet prefix + port GUID), always valid.
        return 0, _read(port_dir / "gids" / "0")
    fallback: tuple[int | None, str | None] = (None, None)
    for idx in _numeric_entries(port_dir / "gids"):
        gid = _read(port_dir / "gids" / str(idx))
        if _is_zero_gid(gid):
            continue
        gtype = (_read(port_dir / "gid_attrs" / "types" / str(idx)) or "").lower()
        if gtype != "roce v2":
            continue
        # RoCE v2 with an IPv4-mapped GID is routable across L3 fabrics; an IPv6
        # (usually link-local) one only works within the L2 segment, hence the fallback.
        if gid is not None and ipv4_from_gid(gid):
            return idx, gid
        if fallback[0] is None:
            fallback = (idx, gid)
    return fallback


def _netdev(dev_dir: Path, port_dir: Path, gid_index: int | None) -> str | None:
    if gid_index is not None:
        nd = _read(port_dir / "gid_attrs" / "ndevs" / str(gid_index))
        if nd:
            return nd
    net = dev_dir / "device" / "net"
    if net.is_dir():
        names = sorted((p.name for p in net.iterdir()), key=_natural_key)
        if names:
            return names[0]
    return None


def read_device(sysfs: Path, name: str) -> RdmaDevice:
    dev_dir = sysfs / "class" / "infiniband" / name
    ports = []
    for n in _numeric_entries(dev_dir / "ports"):
        port_dir = dev_dir / "ports" / str(n)
        raw_state = _read(port_dir / "state") or ""
        # "4: ACTIVE" -> "ACTIVE"
        state = raw_state.split(":", 1)[-1].strip().upper() or "UNKNOWN"
        link_layer = _read(port_dir / "link_layer") or "InfiniBand"
        gid_index, gid = select_gid(port_dir, link_layer)
        ports.append(
            RdmaPort(
                device=name,
                port=n,
                state=state,
                link_layer=link_layer,
                gid_index=gid_index,
                gid=gid,
                ipv4=ipv4_from_gid(gid) if gid else None,
                netdev=_netdev(dev_dir, port_dir, gid_index),
            )
        )
    return RdmaDevice(name=name, vendor=vendor_of(name), ports=tuple(ports))


def default_route_iface(route_path: Path = PROC_NET_ROUTE) -> str | None:
    """The netdev of the IPv4 default route with the lowest metric, from /proc/net/route."""
    text = _read(route_path)
    if not text:
        return None
    best: tuple[int, str] | None = None
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        iface, dest, flags, metric, mask = cols[0], cols[1], cols[3], cols[6], cols[7]
        try:
            up = int(flags, 16) & 0x1
            metric_n = int(metric)
        except ValueError:
            continue
        if dest == "00000000" and mask == "00000000" and up and (best is None or metric_n < best[0]):
            best = (metric_n, iface)
    return best[1] if best else None


# --------------------------------------------------------------------------- QoS


@dataclass(frozen=True)
class Qos:
    traffic_class: int | None = None
    service_level: int | None = None


def _default_runner(argv: Sequence[str], timeout: float) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=True).stdout


def _pick_dscp(spec: str) -> int | None:
    """From '24, 26-28' pick 26 when present (the RoCE v2 convention), else the first value."""
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    values: list[int] = []
    for tok in tokens:
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", tok)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo <= 26 <= hi:
                return 26
            values.append(lo)
        elif tok.isdigit():
            if int(tok) == 26:
                return 26
            values.append(int(tok))
    return values[0] if values else None


def parse_nicctl_qos(text: str) -> Qos | None:
    """Best effort over `nicctl show qos` text: the first PFC no-drop priority that has a
    DSCP mapped to it gives SL (that priority) and TC (DSCP << 2, the DSCP bits of the
    IP TOS byte). None when the output does not have those lines."""
    m = re.search(r"PFC no-drop priorities\s*:\s*([\d,\s]+)", text)
    if not m:
        return None
    no_drop = [int(p) for p in re.findall(r"\d+", m.group(1))]
    dscp_by_prio: dict[int, str] = {}
    for dm in re.finditer(r"^\s*DSCP\s*:\s*(.+?)\s*==>\s*priority\s*:\s*(\d+)\s*$", text, re.MULTILINE):
        dscp_by_prio.setdefault(int(dm.group(2)), dm.group(1))
    for prio in no_drop:
        dscp = _pick_dscp(dscp_by_prio.get(prio, ""))
        if dscp is not None and 0 <= dscp < 64 and 0 <= prio < 16:
            return Qos(traffic_class=dscp << 2, service_level=prio)
    return None


def _env_int(environ: Mapping[str, str], key: str, hi: int) -> int | None:
    raw = environ.get(key, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > hi:
        raise NicError(f"{key}={raw!r}: expected an integer 0..{hi}")
    return int(raw)


def read_qos(environ: Mapping[str, str], runner: Runner, notices: list[str]) -> Qos:
    tc = _env_int(environ, "PDBENCH_IB_TRAFFIC_CLASS", 255)
    sl = _env_int(environ, "PDBENCH_IB_SL", 15)
    if tc is not None and sl is not None:
        return Qos(tc, sl)
    nicctl = shutil.which("nicctl", path=environ.get("PATH", os.defpath))
    if nicctl is None:
        return Qos(tc, sl)
    try:
        out = runner([nicctl, "show", "qos"], NICCTL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        # nicctl commonly needs root; a batch job cannot answer a sudo prompt, so no sudo.
        notices.append(
            f"nicctl show qos failed ({type(e).__name__}: {e}); RDMA QoS left unset "
            "(set PDBENCH_IB_TRAFFIC_CLASS / PDBENCH_IB_SL)"
        )
        return Qos(tc, sl)
    parsed = parse_nicctl_qos(out)
    if parsed is None:
        notices.append(
            "could not read a PFC no-drop priority and its DSCP from nicctl show qos; "
            "RDMA QoS left unset (set PDBENCH_IB_TRAFFIC_CLASS / PDBENCH_IB_SL)"
        )
        return Qos(tc, sl)
    return Qos(tc if tc is not None else parsed.traffic_class, sl if sl is not None else parsed.service_level)


# --------------------------------------------------------------------------- env


def _parse_override(raw: str) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for item in (s.strip() for s in raw.split(",")):
        if not item:
            continue
        name, _, port = item.partition(":")
        if port and not port.isdigit():
            raise NicError(f"IBDEVICES entry {item!r}: expected NAME or NAME:PORT")
        out.append((name, int(port) if port else None))
    return out


def _nccl_hca(selected: list[str], present: list[str]) -> str:
    # NCCL_IB_HCA matches by prefix: "mlx5_1" also selects mlx5_10..mlx5_19. A leading
    # "=" makes the whole list exact; only needed when such a prefix would catch a
    # device we deliberately left out.
    others = set(present) - set(selected)
    ambiguous = any(o.startswith(s) for s in selected for o in others)
    return ("=" if ambiguous else "") + ",".join(selected)


def _gpu_copy_transports(sysfs: Path) -> list[str]:
    # NIXL moves GPU KV-cache buffers; with UCX_TLS restricted to tcp it cannot touch
    # device memory unless the GPU copy/IPC transports are listed too.
    if (sysfs / "module" / "nvidia").exists():
        return ["cuda_copy", "cuda_ipc"]
    if (sysfs / "module" / "amdgpu").exists():
        return ["rocm_copy", "rocm_ipc"]
    return []


def _tcp_env(sysfs: Path, route_path: Path, fallback_addr: str | None, notices: list[str]) -> NicEnv:
    env: dict[str, str] = {"UCX_TLS": ",".join(["tcp", "self", "sm", *_gpu_copy_transports(sysfs)])}
    iface = default_route_iface(route_path)
    if iface:
        env["UCX_NET_DEVICES"] = iface
    env["NCCL_IB_DISABLE"] = "1"
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
    if fallback_addr:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = fallback_addr
    else:
        notices.append("no address for VLLM_NIXL_SIDE_CHANNEL_HOST (pass a fallback address)")
    return NicEnv(env=env, notices=notices, transport="tcp")


def detect(
    sysfs: Path = SYSFS,
    environ: Mapping[str, str] | None = None,
    fallback_addr: str | None = None,
    route_path: Path = PROC_NET_ROUTE,
    runner: Runner = _default_runner,
) -> NicEnv:
    """The NIC environment for this node. Raises NicError for a bad IBDEVICES / QoS override."""
    environ = os.environ if environ is None else environ
    notices: list[str] = []
    present = list_devices(sysfs)

    override = _parse_override(environ.get("IBDEVICES", ""))
    if override:
        missing = [n for n, _ in override if n not in present]
        if missing:
            raise NicError(
                f"IBDEVICES names RDMA device(s) not on this node: {', '.join(missing)} "
                f"(present: {', '.join(present) or 'none'})"
            )
        wanted = override
    else:
        wanted = [(n, None) for n in present]

    ports: list[RdmaPort] = []
    for name, only_port in wanted:
        dev = read_device(sysfs, name)
        chosen = [p for p in dev.ports if only_port is None or p.port == only_port]
        if only_port is not None and not chosen:
            raise NicError(f"IBDEVICES: {name} has no port {only_port}")
        if not dev.ports:
            notices.append(f"{name}: no ports in sysfs; left out")
        for p in chosen:
            if p.active:
                ports.append(p)
            else:
                notices.append(f"{name} port {p.port} is {p.state}; left out")

    if not ports:
        if override:
            # An explicit device list that silently became TCP would skew a benchmark.
            raise NicError(f"IBDEVICES={environ['IBDEVICES']}: none of its ports is ACTIVE")
        notices.append("no active RDMA device found; using TCP")
        return _tcp_env(sysfs, route_path, fallback_addr, notices)

    names = list(dict.fromkeys(p.device for p in ports))
    env: dict[str, str] = {
        "IBDEVICES": ",".join(names),
        "UCX_NET_DEVICES": ",".join(f"{p.device}:{p.port}" for p in ports),
        "NCCL_IB_HCA": _nccl_hca(names, present),
        # MoRI (MoRI-IO, MoRI EP) picks its NICs itself otherwise, by a PCIe-topology walk
        # that the seed's jobs had to patch around: give it the same devices.
        "MORI_RDMA_DEVICES": ",".join(names),
    }

    roce = [p for p in ports if p.is_roce]
    if roce and len(roce) != len(ports):
        notices.append("both RoCE and InfiniBand ports are active; the GID index is chosen for RoCE")
    for p in roce:
        if p.gid_index is None:
            notices.append(f"{p.device} port {p.port}: no RoCE v2 GID; it will use the library's default")
        elif p.ipv4 is None:
            notices.append(
                f"{p.device} port {p.port}: no IPv4-mapped RoCE v2 GID; "
                f"using GID index {p.gid_index} ({p.gid}), routable only within its L2 segment"
            )
    if roce:
        # UCX and NCCL take one GID index for all devices; use the majority (ties: first).
        counts = Counter(p.gid_index for p in roce if p.gid_index is not None)
        gid_index = counts.most_common(1)[0][0] if counts else None
        odd = [
            f"{p.device}:{p.port}={p.gid_index}" for p in roce if p.gid_index is not None and p.gid_index != gid_index
        ]
        if odd:
            notices.append(f"RoCE GID index differs across ports ({', '.join(odd)}); using {gid_index}")
    else:
        gid_index = 0
    if gid_index is not None:
        env["UCX_IB_GID_INDEX"] = env["NCCL_IB_GID_INDEX"] = env["MORI_IB_GID_INDEX"] = str(gid_index)

    qos = read_qos(environ, runner, notices)
    # MoRI reads its own QoS variables (MORI_IO_* for MoRI-IO's ibverbs path, MORI_RDMA_* for
    # the ionic/bnxt providers and MoRI EP); without them it runs at SL 0 with no traffic class.
    for key, value in (
        ("UCX_IB_TRAFFIC_CLASS", qos.traffic_class),
        ("UCX_IB_SL", qos.service_level),
        ("NCCL_IB_TC", qos.traffic_class),
        ("NCCL_IB_SL", qos.service_level),
        ("MORI_IO_TC", qos.traffic_class),
        ("MORI_RDMA_TC", qos.traffic_class),
        ("MORI_IO_SL", qos.service_level),
        ("MORI_RDMA_SL", qos.service_level),
    ):
        if value is not None:
            env[key] = str(value)

    rdma_ip = next((p.ipv4 for p in ports if p.ipv4), None)
    if rdma_ip:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = rdma_ip
    elif fallback_addr:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = fallback_addr
        notices.append(f"no IPv4 address on the RDMA interfaces; side channel uses {fallback_addr}")
    else:
        notices.append(
            "no IPv4 address on the RDMA interfaces and no fallback address; VLLM_NIXL_SIDE_CHANNEL_HOST left unset"
        )
    return NicEnv(env=env, notices=notices, transport="rdma")


def render_exports(env: NicEnv) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.env.items())
