"""A local prefill/decode pair of real `vllm serve` processes, for tests and benchmarks.

Lives beside the benchmarks (the connector package is only what vLLM loads). Each server
runs under the node supervisor, as a job's servers do: its own session, its log file, its
EngineCore and workers stopped with it. Waits for /health, and speaks the two-phase flow
the proxy uses: prefill with ``do_remote_decode``, then decode with the
``kv_transfer_params`` prefill returned.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.executor import BACKEND_FLAG, as_run, flag_value, replaces_uni
from harness.config.load import load_catalogue
from harness.config.schema import ModelSpec
from harness.proxy.backends import Backend
from harness.proxy.flows import PdbenchFlow, TwoPhaseFlow
from harness.render.commands import flag_words, omp_threads
from harness.supervisor import Managed, Supervisor, signal_group
from harness.validity.series import Scrape

REPO = Path(__file__).resolve().parent.parent
_LEGS = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="prefill-leg")  # overlapped prefill legs
# What the proxy sends prefill for NIXL and the bundled connector (one definition).
PREFILL_PARAMS = TwoPhaseFlow.PREFILL_KV
# The proxy's own overlapped flow shapes the legs of pd_stream(overlap=True).
OVERLAP_FLOW = PdbenchFlow(overlap=True)


def vllm_bin() -> str:
    return str(Path(sys.executable).with_name("vllm"))


@dataclass
class Server:
    """One `vllm serve` under its own node supervisor (own session, real PID, reaped)."""

    name: str
    port: int
    supervisor: Supervisor
    managed: Managed

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.managed.popen

    @property
    def log(self) -> Path:
        return self.managed.log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's session and every descendant, SIGKILL what is left after `timeout`."""
        self.supervisor.stop_all(timeout)

    def kill(self) -> None:
        """A crash: SIGKILL the whole session at once."""
        signal_group(self.proc.pid, signal.SIGKILL)
        self.supervisor.stop_all(0)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def kv_config(
    connector: str, role: str, extra: dict[str, Any] | None = None, failure_policy: str | None = None
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"kv_role": role}
    if connector == "pdbench":
        cfg.update(kv_connector="PdbenchConnector", kv_connector_module_path="connector")
    elif connector == "nixl":
        cfg.update(kv_connector="NixlConnector", kv_buffer_device="cpu")
    else:
        raise ValueError(connector)
    if extra:
        cfg["kv_connector_extra_config"] = extra
    if failure_policy:
        cfg["kv_load_failure_policy"] = failure_policy
    return cfg


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def start_server(
    name: str,
    model: str,
    port: int,
    cpus: str,
    log_dir: Path,
    *,
    kv: dict[str, Any] | None = None,
    dummy: bool = False,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    max_model_len: int = 2048,
    tp: int = 1,
) -> Server:
    if not port_free(port):
        raise RuntimeError(f"port {port} is in use: {name} would talk to someone else's server")
    argv = [
        vllm_bin(),
        "serve",
        model,
        "--port",
        str(port),
        "--served-model-name",
        "m",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        "32",
    ]
    if dummy:
        argv += ["--load-format", "dummy"]
    if kv is not None:
        argv += ["--kv-transfer-config", json.dumps(kv)]
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    # The catalogue's executor and environment for this model, as a job's server of `tp` ranks
    # runs them (models.yaml's CPU models: `uni` in one engine process, `mp` past one rank).
    entry = catalogue_entry(model)
    backend = {BACKEND_FLAG: flag_value(entry.prefill_flags, BACKEND_FLAG)}
    flags, model_env = as_run(backend, entry.env, replaces_uni(entry.prefill_flags, tp))
    argv += flag_words(flags)
    argv += extra_args or []
    e = dict(os.environ)
    e.update(model_env)
    e.update(
        {
            "OMP_NUM_THREADS": omp_threads(cpus),
            "VLLM_CPU_OMP_THREADS_BIND": cpus,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")])),
        }
    )
    e.update(env or {})
    sup = Supervisor(log_dir)
    return Server(name, port, sup, sup.start(name, argv, e, cwd=REPO))


def catalogue_entry(model: str) -> ModelSpec:
    """models.yaml's entry whose path is the model directory `model`."""
    models = REPO / "models.yaml"
    for entry in load_catalogue(models).models.values():
        if entry.path is not None and (models.parent / entry.path).resolve() == Path(model).resolve():
            return entry
    raise ValueError(f"{model}: no model of {models} has this path (its executor and environment come from there)")


def wait_healthy(servers: list[Server], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for s in list(pending):
            if not s.alive():
                raise RuntimeError(f"{s.name} exited with {s.proc.returncode}:\n{s.log_tail()}")
            try:
                with urllib.request.urlopen(f"{s.url}/health", timeout=2) as r:
                    if r.status == 200:
                        pending.remove(s)
            except OSError:
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"not healthy after {timeout:.0f} s: {[s.name for s in pending]}")
        if pending:
            time.sleep(1.0)


@dataclass
class Pair:
    prefill: Server
    decode: Server
    extra: dict[str, Any] = field(default_factory=dict)
    # The prefill as the proxy sees it: its KV endpoint, learned from its answers, is what the
    # overlapped flow (proxy.overlap) sends decode before prefill answers.
    backend: Backend = field(default_factory=lambda: Backend("prefill", "http://127.0.0.1"))

    @property
    def endpoint(self) -> dict[str, Any] | None:
        return self.backend.kv_endpoint

    def stop(self) -> None:
        for s in (self.decode, self.prefill):
            s.stop()


def start_pair(
    model: str,
    log_dir: Path,
    *,
    connector: str = "pdbench",
    prefill_port: int = 18150,
    decode_port: int = 18250,
    kv_port: int = 15650,
    extra: dict[str, Any] | None = None,
    decode_extra: dict[str, Any] | None = None,
    failure_policy: str | None = None,
    dummy: bool = False,
    max_model_len: int = 2048,
    timeout: float = 420.0,
    pin: str = "instance",
    extra_args: list[str] | None = None,
    prefill_tp: int = 1,
    decode_tp: int = 1,
) -> Pair:
    """Prefill on core 0, decode on core 1; both stopped again if either fails to start.

    `pin`: "instance" keeps each server's whole process tree on its core, as `pdbench node`
    does (harness/node/affinity.py); "model" only sets each worker's main thread (the model
    forward; vLLM binds the OpenMP threads), what `pdbench node` did before 2026-11-25.
    A side with TP 2 runs one worker on each core (vllm-cpu's TP, for the differing-TP tests).
    """
    if {prefill_tp, decode_tp} - {1, 2} or pin not in PINS:
        raise ValueError(f"TP 1 or 2 on this pair's two cores; pin one of {PINS}")
    cpus_p, cpus_d = ("0|1" if prefill_tp == 2 else "0"), ("0|1" if decode_tp == 2 else "1")

    env_p: dict[str, str] = {}
    env_d: dict[str, str] = {}
    p_extra = dict(extra or {})
    if connector == "pdbench":
        p_extra.setdefault("port", kv_port)
        p_extra.setdefault("host", "127.0.0.1")
    else:
        env_p = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(kv_port), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
        env_d = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(kv_port + 1), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
    d_extra = {**p_extra, **(decode_extra or {})}
    for port in (kv_port, kv_port + 1):
        if not port_free(port):
            raise RuntimeError(f"KV port {port} is in use")
    p = start_server(
        "prefill",
        model,
        prefill_port,
        cpus_p,
        log_dir,
        env=env_p,
        dummy=dummy,
        kv=kv_config(connector, "kv_producer", p_extra),
        max_model_len=max_model_len,
        extra_args=extra_args,
        tp=prefill_tp,
    )
    d = start_server(
        "decode",
        model,
        decode_port,
        cpus_d,
        log_dir,
        env=env_d,
        dummy=dummy,
        kv=kv_config(connector, "kv_consumer", d_extra, failure_policy),
        max_model_len=max_model_len,
        extra_args=extra_args,
        tp=decode_tp,
    )
    pair = Pair(p, d, p_extra)
    try:
        wait_healthy([p, d], timeout)
        _pin(p, cpus_p, pin)
        _pin(d, cpus_d, pin)
    except BaseException:
        pair.stop()
        raise
    return pair


def start_single(
    model: str,
    log_dir: Path,
    *,
    port: int = 18350,
    dummy: bool = False,
    max_model_len: int = 2048,
    timeout: float = 420.0,
    pin: str = "instance",
    extra_args: list[str] | None = None,
) -> Server:
    """One aggregated instance without a KV connector, on core 0 and pinned as prefill is."""
    s = start_server(
        "single", model, port, "0", log_dir, dummy=dummy, max_model_len=max_model_len, extra_args=extra_args
    )
    try:
        wait_healthy([s], timeout)
        _pin(s, "0", pin)
    except BaseException:
        s.stop()
        raise
    return s


PINS = ("instance", "model")


def _pin(s: Server, cpus: str, how: str) -> None:
    from harness.node.affinity import parse_cpus, pin_instance, worker_processes

    if how == "instance":
        pin_instance(s.proc.pid, cpus)
        return
    if "|" in cpus:
        return  # TP: vLLM's own per-worker binding
    for w in worker_processes(s.proc.pid):  # NixlConnector moves each worker's main thread away
        try:
            os.sched_setaffinity(w.pid, parse_cpus(cpus))
        except OSError:
            pass


# -- HTTP ---------------------------------------------------------------------------


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"error": raw.decode(errors="replace")}


def prefill(
    pair_or_url: Pair | str, body: dict[str, Any], timeout: float = 120.0, pull_key: str | None = None
) -> dict[str, Any]:
    url = pair_or_url.prefill.url if isinstance(pair_or_url, Pair) else pair_or_url
    kv = dict(PREFILL_PARAMS, **({"pull_key": pull_key} if pull_key else {}))
    b = dict(body, max_tokens=1, stream=False, kv_transfer_params=kv)
    b.pop("stream_options", None)
    status, out = post_json(f"{url}/v1/completions", b, timeout)
    if status != 200:
        raise RuntimeError(f"prefill HTTP {status}: {out}")
    params = out.get("kv_transfer_params")
    if not params:
        raise RuntimeError(f"prefill returned no kv_transfer_params: {out}")
    if isinstance(pair_or_url, Pair):
        OVERLAP_FLOW.prefill_answered(pair_or_url.backend, params)
    return params


def complete(url: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    return post_json(f"{url}/v1/completions", body, timeout)


def pd_complete(pair: Pair, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    params = prefill(pair, body, timeout)
    return complete(pair.decode.url, dict(body, kv_transfer_params=params), timeout)


@dataclass
class StreamResult:
    ttft: float  # seconds from the first HTTP call (prefill leg included) to the first token
    decode_ttft: float  # seconds from the decode call to its first token
    tokens: int
    tok_s: float  # (tokens - 1) / (last token - first token), vLLM bench's definition
    text: str
    events: int = 0  # SSE events with text: one per token at stream_interval 1, none while a token adds no text


def pd_stream(
    pair: Pair | None, url: str, body: dict[str, Any], timeout: float = 120.0, overlap: bool = False
) -> StreamResult:
    """Streamed decode leg (after a prefill leg when `pair` is given): TTFT and decode rate.

    `overlap` (pdbench connector, once `pair.endpoint` is known): the proxy's overlapped flow,
    the prefill leg (with a pull key) and the decode leg (pulling by that key) sent at once."""
    t0 = time.perf_counter()
    b = dict(body, stream=True, stream_options={"include_usage": True})
    leg: concurrent.futures.Future[dict[str, Any]] | None = None
    if pair is not None and overlap and OVERLAP_FLOW.concurrent_with(pair.backend):
        key = OVERLAP_FLOW.transfer_id(os.urandom(16).hex())
        leg = _LEGS.submit(prefill, pair, body, timeout, key)
        b["kv_transfer_params"] = OVERLAP_FLOW.decode(body, pair.backend, 0, pair.backend, key, None)[
            "kv_transfer_params"
        ]
    elif pair is not None:
        b["kv_transfer_params"] = prefill(pair, body, timeout)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    t1 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"decode HTTP {resp.status}: {resp.read()[:500]!r}")
    first = last = None
    n, events, text = 0, 0, []
    for line in _sse(resp):
        if line == "[DONE]":
            break
        ev = json.loads(line)
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
                events += 1
                text.append(ch["text"])
        if ev.get("usage"):
            n = ev["usage"]["completion_tokens"]
    conn.close()
    if leg is not None:
        leg.result(timeout)  # the prefill leg's failure, if any
    if first is None or last is None:
        raise RuntimeError("no tokens streamed")
    rate = (n - 1) / (last - first) if n > 1 and last > first else 0.0
    return StreamResult(first - t0, first - t1, n, rate, "".join(text), events)


def _sse(resp: http.client.HTTPResponse) -> Iterator[str]:
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data:"):
            yield line[5:].strip()


# -- metrics --------------------------------------------------------------------------


def scrape(url: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels sorted by name), plus {'name': sum over
    labels}; read by pdbench's one parser (harness.validity.series)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for s in Scrape.parse(text).series:
        labels = "{" + ",".join(f'{k}="{v}"' for k, v in s.labels) + "}" if s.labels else ""
        out[s.name + labels] = s.value
        out[s.name] = out.get(s.name, 0.0) + s.value if labels else s.value
    return out
