"""The TCP ports this node's servers bind are free, and who holds a taken one."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

# Holder lookup for a taken port scans /proc/*/fd; bounded so a host with many processes
# (or a slow /proc) cannot stall the check.
HOLDER_SCAN_S = 2.0


def check_ports(ports: list[int], host: str = "0.0.0.0") -> list[str]:
    """Every TCP port this node's servers bind must be free (bound like servers bind it: with
    SO_REUSEADDR, so a socket in TIME_WAIT from an earlier run does not count)."""
    problems: list[str] = []
    deadline = time.monotonic() + HOLDER_SCAN_S
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    seen: set[int] = set()
    for port in ports:
        if not isinstance(port, int) or not 0 < port < 65536:
            problems.append(f"port {port!r} is not a TCP port number (1-65535); fix the recipe's ports")
            continue
        if port in seen:
            problems.append(
                f"port {port} is assigned twice on this node; two servers would collide (fix the recipe's ports)"
            )
            continue
        seen.add(port)
        problem = _bind_problem(port, host, family, deadline)
        if problem:
            problems.append(problem)
    return problems


def _bind_problem(port: int, host: str, family: socket.AddressFamily, deadline: float) -> str | None:
    """Why `port` cannot be bound on `host`, or None when it can."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            holder = _port_holder(port, deadline)
            by = f" (by {holder})" if holder else ""
            return (
                f"port {port} is in use{by}; stop that process (a server left over from an earlier job?) "
                "or move the recipe's ports"
            )
        if e.errno == errno.EACCES:
            return (
                f"port {port} cannot be bound on {host}: permission denied "
                "(ports below 1024 need root); move the recipe's ports"
            )
        if e.errno == errno.EADDRNOTAVAIL:
            return f"port {port} cannot be bound on {host}: that address is not on this node"
        return f"port {port} cannot be bound on {host}: {e.strerror or e}"
    return None


def _listen_inodes(port: int, proc_net: Path) -> set[str]:
    """Socket inodes bound to `port` (listening, or bound and not connected) in this network namespace."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10:
                continue
            local, state, inode = cols[1], cols[3], cols[9]
            try:
                local_port = int(local.rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            # 0A LISTEN; 07 CLOSE is a socket bound but not listening, which also takes the port.
            if local_port == port and state in ("0A", "07") and inode != "0":
                inodes.add(inode)
    return inodes


def _port_holder(port: int, deadline: float, proc: Path = Path("/proc")) -> str | None:
    """'pid 1234 python3' for the process holding `port`, or None when it cannot be seen
    (another PID namespace, another user's process without privileges, or out of time)."""
    inodes = _listen_inodes(port, proc / "net")
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if time.monotonic() > deadline:
            return None
        if _holds_socket(proc / pid / "fd", targets):
            try:
                comm = (proc / pid / "comm").read_text().strip()
            except OSError:
                comm = ""
            return f"pid {pid} {comm}".rstrip()
    return None


def _holds_socket(fd_dir: Path, targets: set[str]) -> bool:
    """Whether a process's fd directory has one of `targets` ("socket:[inode]") open."""
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd) in targets:
                return True
        except OSError:
            continue
    return False
