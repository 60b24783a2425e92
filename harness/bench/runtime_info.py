"""What the servers behind a benchmark ran, for every result's metadata, read once per sweep
before the first point:

- runtime_versions: per server, the vLLM version the server itself serves (GET /version), and
  the interpreter and its torch, connector library and pdbench versions that the server's node
  recorded (harness.node.versions);
- image_digest: the container image each node ran, as the job scripts recorded it (docker and
  podman: the image's id per node; enroot and apptainer: the image file's sha256, once);
- router: the job's PD router (metadata.proxy) and its version. vllm-router runs in the job's
  Python on the client's node (`python -m vllm_router.launch_router`), so the installed
  distribution this interpreter sees is the one that ran; pdbench's proxy is pdbench's version.

A value that cannot be had is null, with the reason beside it; nothing is guessed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import __version__, kv_connectors
from harness.bench.client_config import ClientConfig
from harness.bench.validity_probe import parse_target
from harness.rundir.package_probe import PROBE_TIMEOUT_S, keys
from harness.rundir.paths import IMAGE_RECORD_GLOB, server_record_name

VERSION_TIMEOUT_S = 5.0
# A node records its servers once they are healthy, which may be just after node 0 saw them
# healthy: wait for the records that long, and for the node's own bound on reading them.
RECORD_WAIT_S = PROBE_TIMEOUT_S + 10.0
PACKAGE_KEYS = keys(kv_connectors.packages())


def served_vllm_version(base_url: str, timeout: float = VERSION_TIMEOUT_S) -> tuple[str | None, str | None]:
    """(version, None) from the server's GET /version, or (None, why not)."""
    url = f"{base_url}/version"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.loads(r.read(65536))
    except (OSError, ValueError) as e:  # URLError, HTTPError, timeouts; bad JSON
        return None, f"GET {url}: {e}"
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, str) or not version:
        return None, f"GET {url}: no version string in {json.dumps(body)[:200]}"
    return version, None


def _read_record(path: Path) -> dict[str, Any] | str:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable {path}: {e}"
    if not isinstance(rec, dict) or not isinstance(rec.get("versions"), dict):
        return f"{path}: not a server record"
    return rec


async def wait_for_records(directory: Path, names: list[str], wait_s: float) -> dict[str, dict[str, Any] | str]:
    """Each server's record from its node, waiting up to wait_s for the missing ones; a missing
    or unreadable record is the reason there is none."""
    deadline = time.monotonic() + wait_s
    paths = {name: directory / server_record_name(name) for name in names}
    while not all(p.exists() for p in paths.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return {
        name: _read_record(p) if p.exists() else f"its node wrote no {p} within {wait_s:g} s"
        for name, p in paths.items()
    }


def server_entry(vllm: tuple[str | None, str | None], record: dict[str, Any] | str) -> dict[str, Any]:
    version, why = vllm
    if isinstance(record, str):
        record = {"versions": {}, "reasons": dict.fromkeys(PACKAGE_KEYS, record)}
    versions = {k: record["versions"].get(k) for k in PACKAGE_KEYS}
    reasons = {k: str(record["reasons"].get(k) or "not recorded") for k in PACKAGE_KEYS if versions[k] is None}
    if version is None:
        reasons = {"vllm": str(why)} | reasons
    return {
        "vllm": version,
        **versions,
        "python": record.get("python"),
        "python_version": record.get("python_version"),
        "node": record.get("node"),
        "reasons": reasons,
    }


def image_digest(directory: Path | None, container_runtime: Any) -> dict[str, Any]:
    """{"digest": the one image digest every record names, or null; "reason": why null;
    "records": each node's (or the job's) record as written}."""
    records: dict[str, Any] = {}
    if directory is None:
        reason = "not run by a pdbench job (no runtime_records_dir): the image is not known"
    else:
        for f in sorted(directory.glob(IMAGE_RECORD_GLOB)):
            try:
                records[f.stem.removeprefix("image-")] = json.loads(f.read_text())
            except (OSError, ValueError) as e:
                records[f.stem.removeprefix("image-")] = {"digest": None, "reason": f"unreadable {f}: {e}"}
        reason = (
            "no container: container.runtime is none, the servers ran on the host's python"
            if container_runtime == "none"
            else f"no image record in {directory}"
        )
    digests = {k: r.get("digest") if isinstance(r, dict) else None for k, r in records.items()}
    known = sorted({d for d in digests.values() if isinstance(d, str)})
    if records and len(known) == 1 and all(isinstance(d, str) for d in digests.values()):
        return {"digest": known[0], "reason": None, "records": records}
    if len(known) > 1:
        reason = "the nodes ran different images: " + ", ".join(f"{k} {d}" for k, d in digests.items())
    elif records:
        k, r = next((k, r) for k, r in records.items() if not isinstance(digests[k], str))
        why = r.get("reason") if isinstance(r, dict) else None
        reason = f"{k}: {why or 'no digest recorded'}"
    return {"digest": None, "reason": reason, "records": records}


async def runtime_metadata(cfg: ClientConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """metadata.runtime_versions (per server) and metadata.image_digest for this sweep's results."""
    servers = {name: url for name, role, url in map(parse_target, cfg.scrape) if role != "proxy"}
    if not servers:  # no server named: the target itself, which may be a vLLM server
        servers = {"target": cfg.base_url}
    served = await asyncio.gather(*(asyncio.to_thread(served_vllm_version, url) for url in servers.values()))
    directory = Path(cfg.result_dir) / cfg.runtime_records_dir if cfg.runtime_records_dir else None
    if directory is not None:
        if not all((directory / server_record_name(n)).exists() for n in servers):
            log(f"waiting (up to {RECORD_WAIT_S:g} s) for the nodes' records of what each server runs on")
        records = await wait_for_records(directory, list(servers), RECORD_WAIT_S)
    else:
        reason = "not run by a pdbench job (no runtime_records_dir): only the server's GET /version was asked"
        records = dict.fromkeys(servers, reason)
    out = {
        "runtime_versions": {name: server_entry(v, records[name]) for name, v in zip(servers, served, strict=True)},
        "image_digest": image_digest(directory, cfg.metadata.get("container_runtime")),
    }
    kind = cfg.metadata.get("proxy")
    if isinstance(kind, str):
        out["router"] = router_record(kind)
    return out


def router_record(kind: str) -> dict[str, Any]:
    """{kind, version, python} of the job's router; version null with the reason when unknown."""
    if kind == "pdbench":
        return {"kind": kind, "version": __version__, "python": sys.executable}
    if kind == "vllm-router":
        try:
            version = importlib.metadata.version("vllm-router")
        except importlib.metadata.PackageNotFoundError:
            return {"kind": kind, "version": None, "python": sys.executable, "reason": "no vllm-router distribution"}
        return {"kind": kind, "version": version, "python": sys.executable}
    return {"kind": kind, "version": None, "python": None, "reason": f"unknown router kind {kind!r}"}
