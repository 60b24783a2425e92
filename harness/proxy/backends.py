"""Prefill and decode instances, their health and circuit state, and routing policies."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from harness.proxy.config import ProxyConfig
from harness.proxy.shared import SharedState

log = logging.getLogger(__name__)

Role = Literal["prefill", "decode", "aggregated"]  # aggregated: a whole instance (connector none)
ROLES: tuple[Role, Role, Role] = ("prefill", "decode", "aggregated")
Source = Literal["static", "gen1", "gen2"]

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64 finalizer: a cheap, well-spread 64-bit hash of an integer."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(eq=False)
class Backend:
    """One prefill or decode instance (one HTTP server, possibly with DP ranks behind it)."""

    role: Role
    url: str  # base URL, e.g. http://10.0.0.1:8100
    source: Source = "static"
    dp_size: int = 1
    tp_size: int = 1
    # MoRI-IO registration details.
    handshake_port: int | None = None
    notify_port: int | None = None
    zmq_address: str | None = None
    transfer_mode: str | None = None
    last_seen: float = 0.0
    # Mooncake: the prefill's bootstrap server and the engine id of each DP rank.
    bootstrap_addr: str | None = None
    engine_ids: dict[int, str] = field(default_factory=dict)
    # pdbench connector: the prefill's KV endpoint (engine id, host, port, TP size), learned
    # from its first kv_transfer_params; the overlapped flow needs it before prefill answers.
    kv_endpoint: dict[str, Any] | None = None
    # Health (polled) and circuit breaker (request outcomes; the circuit's state and the
    # legs in flight are properties: with --workers they live in the shared mapping).
    healthy: bool = False
    health_misses: int = 0
    fails: int = 0
    picks: int = 0  # legs routed here by this process
    peak: int = 0  # most legs in flight here at once (from every proxy process)
    metrics: Any = None  # per-backend metric children, set by ProxyMetrics

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.host = parts.hostname or ""
        self.ssl = parts.scheme == "https"
        self.port = parts.port or (443 if self.ssl else 80)
        self.key = _mix64(hash64(self.url.encode()))
        # This process's own storage until share() moves it into the workers' mapping.
        self._counts: Any = [0]
        self._mine = 0
        self._cells: tuple[int, ...] = (0,)
        self._circuit: Any = [0.0]
        self._slot = 0

    def share(self, state: SharedState, slot: int) -> None:
        """Keep legs in flight and circuit state in `state`'s column `slot`."""
        mine, cells = state.columns(slot)
        state.counts[mine] = self.outstanding
        state.circuit[slot] = self._circuit[self._slot]
        self._counts, self._mine, self._cells = state.counts, mine, cells
        self._circuit, self._slot = state.circuit, slot

    @property
    def outstanding(self) -> int:
        """This process's legs in flight to this instance."""
        return int(self._counts[self._mine])

    @outstanding.setter
    def outstanding(self, n: int) -> None:
        rising = n > self._counts[self._mine]
        self._counts[self._mine] = n
        if rising:
            self.peak = max(self.peak, self.load())

    def load(self) -> int:
        """Legs in flight to this instance from every proxy process."""
        c = self._counts
        return sum([c[i] for i in self._cells]) if len(self._cells) > 1 else int(c[self._mine])

    @property
    def out_since(self) -> float | None:
        """When the circuit breaker took this instance out (monotonic clock); None: in."""
        return float(self._circuit[self._slot]) or None

    @out_since.setter
    def out_since(self, when: float | None) -> None:
        self._circuit[self._slot] = when or 0.0

    @property
    def label(self) -> str:
        return f"{self.role} {self.url}"

    def fresh(self, now: float, ttl: float) -> bool:
        # Gen-2 instances heartbeat; a silent one is gone. Others never expire.
        return self.source != "gen2" or now - self.last_seen <= ttl

    def describe(self, now: float, ttl: float, ready: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "url": self.url,
            "source": self.source,
            "ready": ready,
            "healthy": self.healthy,
            "circuit_open": self.out_since is not None,
            "outstanding": self.load(),
            "outstanding_peak": self.peak,
            "routed": self.picks,
            "dp_size": self.dp_size,
        }
        if self.source == "gen2":
            out["heartbeat_age_s"] = round(now - self.last_seen, 3)
        if self.engine_ids:
            out["engine_ids"] = {str(k): v for k, v in sorted(self.engine_ids.items())}
        return out


class Pool:
    """All known instances of both roles and the routing policy over the available ones."""

    def __init__(self, cfg: ProxyConfig) -> None:
        self.cfg = cfg
        # Prefills ready only once their bootstrap server named their engines (read per pick).
        self._engines_needed = cfg.use.bootstrap_port is not None
        self.backends: dict[Role, list[Backend]] = {role: [] for role in ROLES}
        self._rr = dict.fromkeys(ROLES, 0)

    def share(self, state: SharedState) -> None:
        """Share the instances known now (the static ones, in order) with the other workers."""
        for slot, b in enumerate(self.all()):
            b.share(state, slot)

    def all(self) -> list[Backend]:
        return [b for role in ROLES for b in self.backends[role]]

    def find(self, role: Role, url: str) -> Backend | None:
        for b in self.backends[role]:
            if b.url == url:
                return b
        return None

    def add(self, backend: Backend) -> Backend:
        self.backends[backend.role].append(backend)
        return backend

    def remove(self, backend: Backend) -> None:
        self.backends[backend.role].remove(backend)

    def ready(self, b: Backend, now: float) -> bool:
        """Healthy, registered (if it registers) and, for a prefill with a bootstrap server
        (Mooncake), its engines known."""
        if not b.healthy or not b.fresh(now, self.cfg.registration_ttl_s):
            return False
        return not (self._engines_needed and b.role == "prefill" and not b.engine_ids)

    def available(self, role: Role, now: float) -> list[Backend]:
        return [b for b in self.backends[role] if b.out_since is None and self.ready(b, now)]

    def count_available(self, role: Role, now: float) -> int:
        return sum(1 for b in self.backends[role] if b.out_since is None and self.ready(b, now))

    # -- routing -----------------------------------------------------------

    def pick(self, role: Role, key: int | None, now: float) -> tuple[Backend, int] | None:
        """Choose (instance, DP rank) for one leg; None when no instance is available."""
        cands = self.available(role, now)
        if not cands:
            return None
        policy = self.cfg.policy
        if policy in ("prefix_hash", "session") and key is not None:
            # Rendezvous hashing: the same prefix (session) keeps its instance while others come
            # and go, in every proxy process alike; only an instance's own keys move when it leaves.
            b = max(cands, key=lambda c: _mix64(c.key ^ key))
            rank = (key >> 17) % b.dp_size
        elif policy == "least_outstanding":
            n = self._rr[role]
            self._rr[role] = n + 1
            k = len(cands)
            b = min((cands[(n + i) % k] for i in range(k)), key=lambda c: c.load())
            rank = b.picks % b.dp_size
        else:
            # Round-robin over flat (instance, DP rank) slots, so every rank gets its turn.
            n = self._rr[role]
            self._rr[role] = n + 1
            if all(c.dp_size == 1 for c in cands):
                b, rank = cands[n % len(cands)], 0
            else:
                total = sum(c.dp_size for c in cands)
                slot = n % total
                for b in cands:
                    if slot < b.dp_size:
                        break
                    slot -= b.dp_size
                rank = slot
        b.picks += 1
        return b, rank

    # -- health and circuit breaker ---------------------------------------

    def record_success(self, b: Backend) -> None:
        b.fails = 0

    def record_failure(self, b: Backend, why: str) -> None:
        """A leg failed through the backend's fault; enough in a row take it out."""
        b.fails += 1
        if b.fails >= self.cfg.breaker_failures and b.out_since is None:
            b.out_since = time.monotonic()
            log.warning("%s taken out after %d failures in a row (last: %s)", b.label, b.fails, why)

    def record_health(self, b: Backend, ok: bool, reason: str) -> None:
        now = time.monotonic()
        if ok:
            b.health_misses = 0
            if not b.healthy:
                log.info("%s is healthy", b.label)
            b.healthy = True
            if b.out_since is not None and now - b.out_since >= self.cfg.breaker_min_open_s:
                b.out_since, b.fails = None, 0
                log.info("%s re-admitted: health check passed", b.label)
            return
        b.health_misses += 1
        # Log transitions only: a backend loading for minutes must not flood the log.
        if b.healthy and b.health_misses >= self.cfg.health_failures:
            b.healthy = False
            log.warning("%s became unhealthy: %s", b.label, reason)
