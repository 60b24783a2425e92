"""What each server ran: its interpreter's package versions, read by its node from the running
process (harness.node.versions, with real subprocesses of this venv's python), and what the
bench client makes of the records and of each server's GET /version (harness.bench.runtime_info)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import harness
from harness import kv_connectors
from harness.bench.client_config import ClientConfig
from harness.bench.runtime_info import (
    image_digest,
    runtime_metadata,
    served_vllm_version,
    server_entry,
    wait_for_records,
)
from harness.node.versions import Interpreter, probe, record_servers, server_interpreter, server_records
from harness.render.vllm_flags import vllm_version
from harness.rundir import package_probe
from harness.rundir.paths import server_record_name

pytestmark = pytest.mark.timeout(60)

VENV_PYTHON = os.path.normpath(sys.executable)  # what argv[0] of a process started with it says
SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def spawn() -> Iterator:
    """Start stand-ins for servers; every one is killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        procs.append(p)
        # Popen may return while the kernel is still setting up the program's arguments
        # (vfork resumes the parent mid-exec): wait until /proc shows them, as a server has.
        cmdline, deadline = Path(f"/proc/{p.pid}/cmdline"), time.monotonic() + 5
        while p.poll() is None and not cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- the node: the interpreter a server runs in, and its packages -----------------------------


def test_a_server_started_as_a_script_is_probed_in_its_own_interpreter(spawn, tmp_path: Path) -> None:
    # `vllm` is a script whose shebang names the venv's python: argv[0] is that python.
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\n{SLEEP}\n")
    script.chmod(0o755)
    server = spawn([str(script), "serve", "model"])
    interp = server_interpreter(server.pid)
    assert isinstance(interp, Interpreter) and interp.python == VENV_PYTHON, interp

    (rec,) = server_records(3, {"prefill-0": server.pid}).values()
    assert rec["server"] == "prefill-0" and rec["node"] == 3 and rec["pid"] == server.pid
    assert rec["python"] == VENV_PYTHON
    assert rec["python_version"] == ".".join(map(str, sys.version_info[:3]))
    torch = _installed("torch")
    assert torch is not None, "the venv has torch (scripts/setup.sh)"
    assert rec["versions"]["torch"] == torch
    assert rec["versions"]["pdbench"] == harness.__version__
    assert rec["versions"]["nixl"] == _installed("nixl")
    assert rec["versions"]["vllm_package"] == vllm_version()  # the distribution, with its +cpu label
    # A package this venv lacks is null with the reason; one it has has no reason.
    for key, version in rec["versions"].items():
        assert (version is None) == (key in rec["reasons"]), (key, rec)
    # MoRI needs ROCm: no machine here has it. Mooncake's CPU build is reported by its own name.
    assert _installed("mori") is None
    assert rec["versions"]["mori"] is None
    assert "not installed in " + VENV_PYTHON in rec["reasons"]["mori"]
    mooncake = _installed("mooncake-transfer-engine") or _installed("mooncake-transfer-engine-non-cuda")
    assert rec["versions"]["mooncake-transfer-engine"] == mooncake


def test_a_bare_interpreter_name_is_found_on_the_servers_own_path(spawn) -> None:
    venv_bin = str(Path(sys.executable).parent)
    server = spawn(["python", "-c", SLEEP], env={"PATH": venv_bin})
    interp = server_interpreter(server.pid)
    assert isinstance(interp, Interpreter), interp
    assert interp.python == os.path.join(venv_bin, "python") and interp.env == {"PATH": venv_bin}


def test_one_probe_per_interpreter(spawn, caplog) -> None:
    a, b = spawn([sys.executable, "-c", SLEEP]), spawn([sys.executable, "-c", SLEEP])
    caplog.set_level("INFO", logger="harness.node.versions")
    records = server_records(0, {"decode-0": a.pid, "decode-1": b.pid})
    assert records["decode-0"]["versions"] == records["decode-1"]["versions"]
    assert records["decode-1"]["pid"] == b.pid
    assert sum("packages of" in r.message for r in caplog.records) == 1


def test_a_renamed_or_gone_process_is_a_reason_not_a_guess(spawn) -> None:
    # vLLM renames some processes (setproctitle): argv[0] then names no interpreter.
    renamed = spawn(["VLLM::APIServer", "-c", SLEEP], executable=sys.executable)
    gone = spawn([sys.executable, "-c", "pass"])
    gone.wait(timeout=10)
    records = server_records(1, {"prefill-0": renamed.pid, "prefill-1": gone.pid})
    assert "'VLLM::APIServer' does not name a python interpreter" in records["prefill-0"]["reasons"]["torch"]
    assert f"cannot read process {gone.pid} in /proc" in records["prefill-1"]["reasons"]["torch"]
    for rec in records.values():
        assert rec["python"] is None and set(rec["versions"].values()) == {None}
        assert set(rec["reasons"]) == set(rec["versions"])


def test_a_server_under_a_wrapper_is_probed_in_its_python_child(spawn, tmp_path: Path) -> None:
    # nsys profile (benchmark.profile.tool nsys) runs the server as its child, and sh -c
    # before it: the node's pid is the wrapper's, whose argv[0] names no interpreter.
    wrapper = tmp_path / "nsys"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" -c "{SLEEP}"\n')  # no exec: a child
    wrapper.chmod(0o755)
    server = spawn(["sh", "-c", 'exec "$0" profile', str(wrapper)])
    deadline = time.monotonic() + 10
    while not [c for c in _children(server.pid) if c != server.pid] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _children(server.pid), "the wrapper started its child"
    interp = server_interpreter(server.pid)
    assert isinstance(interp, Interpreter) and interp.python == VENV_PYTHON, interp
    # A wrapper without a python child keeps its own reason.
    alone = spawn(["sleep", "60"])
    assert "'sleep' does not name a python interpreter" in str(server_interpreter(alone.pid))


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _fake_python(tmp_path: Path, body: str) -> Interpreter:
    exe = tmp_path / "python3"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return Interpreter(str(exe), {"PATH": "/usr/bin:/bin"})


def test_an_interpreter_that_hangs_or_fails_is_bounded_and_said(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"did not report its packages within 1 s"):
        probe(_fake_python(tmp_path, "exec sleep 30"), timeout=1)
    with pytest.raises(RuntimeError, match=r"exited with 3 reporting its packages: no torch here"):
        probe(_fake_python(tmp_path, "echo no torch here >&2; exit 3"))
    with pytest.raises(RuntimeError, match=r"printed no JSON"):
        probe(_fake_python(tmp_path, "echo hello"))


def test_pdbench_run_from_its_tree_reports_its_version(monkeypatch) -> None:
    # In a container pdbench is on PYTHONPATH, not installed: no distribution to read.
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(package_probe.md, "version", missing)
    monkeypatch.setattr(package_probe, "_by_import", [{}])
    out = package_probe.probe(kv_connectors.packages())
    assert out["versions"]["pdbench"] == harness.__version__ and "pdbench" not in out["reasons"]
    assert out["versions"]["torch"] is None and "no distribution torch" in out["reasons"]["torch"]


def test_records_are_written_where_the_client_reads_them(spawn, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    server = spawn([sys.executable, "-c", SLEEP])
    record_servers(tmp_path, 1, {"decode-0": server.pid})
    rec = json.loads((tmp_path / "state" / server_record_name("decode-0")).read_text())
    assert rec["node"] == 1 and rec["versions"]["torch"] == _installed("torch")


# --- the client: GET /version, the nodes' records, the image records ---------------------------


class _VersionServer:
    """A server answering GET `path` with `body` (bytes), 404 elsewhere."""

    def __init__(self, body: bytes, path: str):
        body_, path_ = body, path

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.path == path_
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", str(len(body_) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(body_)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def version_server() -> Iterator:
    servers: list[_VersionServer] = []

    def make(body: bytes, path: str = "/version") -> _VersionServer:
        servers.append(_VersionServer(body, path))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_the_servers_own_version(version_server) -> None:
    assert served_vllm_version(version_server(b'{"version": "0.32.0+cpu"}').url) == ("0.32.0+cpu", None)
    version, why = served_vllm_version(version_server(b'{"version": ""}').url)
    assert version is None and "no version string" in str(why)
    version, why = served_vllm_version(version_server(b"<html>").url)
    assert version is None and "/version" in str(why)
    closed = version_server(b"{}")
    closed.close()
    version, why = served_vllm_version(closed.url, timeout=2)
    assert version is None and why is not None and why.startswith(f"GET {closed.url}/version: ")


def test_wait_for_records_waits_bounded_for_a_late_node(tmp_path: Path) -> None:
    rec = {"server": "decode-0", "node": 1, "python": "/x/python", "versions": {"torch": "2.0"}, "reasons": {}}
    path = tmp_path / server_record_name("decode-0")
    timer = threading.Timer(0.5, lambda: path.write_text(json.dumps(rec)))
    timer.start()
    try:
        got = asyncio.run(wait_for_records(tmp_path, ["decode-0"], 10))
    finally:
        timer.cancel()
    assert got == {"decode-0": rec}
    got = asyncio.run(wait_for_records(tmp_path, ["prefill-0"], 0.3))
    assert got["prefill-0"] == f"its node wrote no {tmp_path / server_record_name('prefill-0')} within 0.3 s"
    (tmp_path / server_record_name("bad")).write_text("{")
    assert str(asyncio.run(wait_for_records(tmp_path, ["bad"], 0))["bad"]).startswith("unreadable ")


def test_a_server_entry_says_why_each_null_is_null() -> None:
    rec = {
        "node": 0,
        "python": "/x/python",
        "python_version": "3.12.1",
        "versions": {"torch": "2.9.0", "nixl": None},
        "reasons": {"nixl": "not installed in /x/python"},
    }
    entry = server_entry((None, "GET http://h:1/version: refused"), rec)
    assert entry["vllm"] is None and entry["torch"] == "2.9.0" and entry["nixl"] is None
    assert entry["reasons"]["vllm"] == "GET http://h:1/version: refused"
    assert entry["reasons"]["nixl"] == "not installed in /x/python"
    assert entry["reasons"]["mori"] == "not recorded"  # a key the record lacks
    assert (entry["python"], entry["python_version"], entry["node"]) == ("/x/python", "3.12.1", 0)
    assert "torch" not in entry["reasons"]


def _image(tmp_path: Path, key: str, digest: str | None, reason: str | None = None) -> None:
    rec = {"node": None, "runtime": "docker", "kind": "image id", "digest": digest, "reason": reason}
    (tmp_path / f"image-{key}.json").write_text(json.dumps(rec))


def test_image_digest_is_the_one_every_node_ran(tmp_path: Path) -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert image_digest(None, "docker")["reason"].startswith("not run by a pdbench job")
    none = image_digest(tmp_path, "none")
    assert none == {"digest": None, "reason": none["reason"], "records": {}}
    assert "container.runtime is none" in none["reason"]
    assert image_digest(tmp_path, "docker")["reason"] == f"no image record in {tmp_path}"
    _image(tmp_path, "node0", a)
    _image(tmp_path, "node1", a)
    got = image_digest(tmp_path, "docker")
    assert got["digest"] == a and got["reason"] is None and set(got["records"]) == {"node0", "node1"}
    _image(tmp_path, "node2", b)
    got = image_digest(tmp_path, "docker")
    assert got["digest"] is None and got["reason"].startswith("the nodes ran different images: ")
    _image(tmp_path, "node2", None, "docker image inspect x: No such image")
    got = image_digest(tmp_path, "docker")
    assert got["digest"] is None and got["reason"] == "node2: docker image inspect x: No such image"
    (tmp_path / "image-node2.json").write_text("{")
    assert image_digest(tmp_path, "docker")["reason"].startswith("node2: unreadable ")


def test_runtime_metadata_of_a_job(spawn, version_server, tmp_path: Path) -> None:
    # Two servers of a job: one answers /version, the other is not vLLM (no /version).
    (tmp_path / "state").mkdir()
    vllm_like, other = version_server(b'{"version": "0.32.0+cpu"}'), version_server(b"", "/metrics")
    server = spawn([sys.executable, "-c", SLEEP])
    record_servers(tmp_path, 0, {"prefill-0": server.pid, "decode-0": server.pid})
    digest = "sha256:" + "c" * 64
    _image(tmp_path / "state", "node0", digest)
    cfg = ClientConfig(
        base_url=vllm_like.url,
        model="m",
        concurrency=[1],
        isl=8,
        osl=2,
        tokenizer="t",
        result_dir=str(tmp_path),
        runtime_records_dir="state",
        scrape=[f"prefill-0=prefill@{vllm_like.url}", f"decode-0=decode@{other.url}", f"p=proxy@{other.url}"],
        metadata={"container_runtime": "docker"},
    )
    md = asyncio.run(runtime_metadata(cfg, lambda s: None))
    assert set(md["runtime_versions"]) == {"prefill-0", "decode-0"}  # servers, not the proxy
    prefill, decode = md["runtime_versions"]["prefill-0"], md["runtime_versions"]["decode-0"]
    assert prefill["vllm"] == "0.32.0+cpu" and "vllm" not in prefill["reasons"]
    assert decode["vllm"] is None and "404" in decode["reasons"]["vllm"]
    assert prefill["torch"] == decode["torch"] == _installed("torch") and prefill["python"] == VENV_PYTHON
    assert md["image_digest"]["digest"] == digest


def test_runtime_metadata_outside_a_job(version_server, tmp_path: Path) -> None:
    target = version_server(b'{"version": "0.11.0"}')
    cfg = ClientConfig(
        base_url=target.url, model="m", tokenizer="t", concurrency=[1], isl=8, osl=2, result_dir=str(tmp_path)
    )
    md = asyncio.run(runtime_metadata(cfg, lambda s: None))
    (entry,) = md["runtime_versions"].values()
    assert md["runtime_versions"]["target"]["vllm"] == "0.11.0"
    assert entry["torch"] is None and "not run by a pdbench job" in entry["reasons"]["torch"]
    assert md["image_digest"]["digest"] is None and "not run by a pdbench job" in md["image_digest"]["reason"]
