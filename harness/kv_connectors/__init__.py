"""The one table of KV connectors: name -> everything pdbench knows about it (entry.py).

Floor 2: imports floor 1, the bundled connector's own settings, and the standard library.
A new connector is one module here holding its ENTRY, one line in _MODULES, and its proxy
flow (harness/proxy/flows.py's FLOWS) when none of the existing flows fits. Everything else
reads the table: the lists below are computed from it, never kept beside it.
"""

from __future__ import annotations

from harness.kv_connectors import mooncake, moriio, nixl, nixlpush, none, pdbench
from harness.kv_connectors.entry import Connector

# In the order help texts and the recipe reference list them.
_MODULES = (nixl, nixlpush, moriio, mooncake, pdbench, none)

TABLE: dict[str, Connector] = {m.ENTRY.name: m.ENTRY for m in _MODULES}
# The aggregated baseline's servers, behind `pdbench proxy --connector none`.
NONE = none.ENTRY


class UnknownConnector(ValueError):
    pass


def kv_names() -> tuple[str, ...]:
    """What a recipe's connector.name may be: the connectors that move KV."""
    return tuple(name for name, c in TABLE.items() if c.moves_kv)


def proxy_names() -> tuple[str, ...]:
    """What `pdbench proxy --connector` accepts."""
    return tuple(TABLE)


def packages() -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """The connectors' packages whose versions every server's runtime record holds, as
    harness.rundir.package_probe takes them (it asks for vLLM's and torch's itself)."""
    return tuple((p.key, p.distributions, p.module) for c in TABLE.values() for p in c.packages)


def get(name: str) -> Connector:
    try:
        return TABLE[name]
    except KeyError:
        raise UnknownConnector(f"unknown KV connector {name!r}; known: {', '.join(sorted(TABLE))}") from None


def get_kv(name: str) -> Connector:
    """A connector that moves KV (not `none`)."""
    entry = TABLE.get(name)
    if entry is None or not entry.moves_kv:
        raise UnknownConnector(f"unknown KV connector {name!r}; known: {', '.join(sorted(kv_names()))}")
    return entry


def accepting(setting: str) -> tuple[str, ...]:
    """The connectors whose proxy takes this ProxyConfig setting."""
    return tuple(name for name, c in TABLE.items() if setting in c.proxy.settings)


def described(names: tuple[str, ...], last: str = "") -> str:
    """'nixl, moriio (MoRI-IO), ...' for help texts; `last` goes before the last name ("or ")."""
    words = [f"{n} ({TABLE[n].summary})" if TABLE[n].summary else n for n in names]
    if words and last:
        words[-1] = last + words[-1]
    return ", ".join(words)
