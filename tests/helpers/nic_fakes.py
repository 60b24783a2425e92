"""A fake sysfs of RDMA devices: ports, GID tables, link layers and net devices, as mlx5 shows them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"

LINK_LOCAL = "fe80:0000:0000:0000:0e42:a1ff:fe00:0001"


def v4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def roce_gids(ip: str | None, ndev: str) -> dict[int, tuple[str, str, str]]:
    """The table mlx5 shows for a RoCE port: v1/v2 link-local, then v1/v2 IPv4, then empty slots."""
    gids = {0: (LINK_LOCAL, "IB/RoCE v1", ndev), 1: (LINK_LOCAL, "RoCE v2", ndev)}
    if ip:
        gids[2] = (v4_gid(ip), "IB/RoCE v1", ndev)
        gids[3] = (v4_gid(ip), "RoCE v2", ndev)
    gids[4] = (ZERO, "", "")
    return gids


def add_device(sysfs: Path, name: str, ports: dict[int, dict], netdevs: Sequence[str] = ()) -> None:
    """ports: {n: {"state": "4: ACTIVE", "link_layer": "Ethernet", "gids": {idx: (gid, type, ndev)}}}.
    An empty type/ndev leaves that attribute file out (real sysfs answers EINVAL there)."""
    dev = sysfs / "class" / "infiniband" / name
    for n, spec in ports.items():
        pdir = dev / "ports" / str(n)
        (pdir / "gids").mkdir(parents=True)
        (pdir / "gid_attrs" / "types").mkdir(parents=True)
        (pdir / "gid_attrs" / "ndevs").mkdir(parents=True)
        (pdir / "state").write_text(spec.get("state", "4: ACTIVE") + "\n")
        (pdir / "link_layer").write_text(spec.get("link_layer", "Ethernet") + "\n")
        for idx, (gid, gtype, ndev) in spec.get("gids", {}).items():
            (pdir / "gids" / str(idx)).write_text(gid + "\n")
            if gtype:
                (pdir / "gid_attrs" / "types" / str(idx)).write_text(gtype + "\n")
            if ndev:
                (pdir / "gid_attrs" / "ndevs" / str(idx)).write_text(ndev + "\n")
    for nd in netdevs:
        (dev / "device" / "net" / nd).mkdir(parents=True)


def roce_port(ip: str | None, ndev: str, state: str = "4: ACTIVE") -> dict:
    return {"state": state, "link_layer": "Ethernet", "gids": roce_gids(ip, ndev)}
