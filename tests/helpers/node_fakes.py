"""Fake processes for the node-runtime tests: they stand in for vLLM, the proxy and the
benchmark client of a server.sh written by the real renderer (stdlib HTTP only, so they
start fast).

    python node_fakes.py server --name prefill-0 --port 8100 [failure options]
    python node_fakes.py bench --proxy-port 30000 [--exit-code 1] [--sleep 60]
    python node_fakes.py as vllm serve MODEL --port 8100 ...   (the command line server.sh runs)
    python node_fakes.py as proxy --port 30000 ...
    python node_fakes.py as bench --config ...

`as` maps the rendered command line onto a fake: the process is the one whose port is
`--port` in $RUN_DIR/fakes.json ({"ports": {name: port}, "flags": {name: [options]}}),
started with the failure options the test gave it. write_bin() writes the `vllm` and
`python` wrappers that send server.sh's commands here.

Every fake (and every process it forks) records its PID and start time in
$RUN_DIR/fakepids/, so a test can prove afterwards that none of them is left.
A server forks one "VLLM::Worker" child in its own process group, as vLLM does.

Why not the mock engine: these tests are about process lifecycles, not HTTP: a server
that exits with a given code after N s, never gets healthy, ignores SIGTERM, or leaves
a forked worker in its own process group, each recording its PID for the leak checks.
The mock engine (harness.mock_engine) is a well-behaved single process and stays so.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RESULT_NAME = "concurrency_1_req_rate_inf_gpus_2_ctx_1_gen_1.json"
AGGREGATED_RESULT_NAME = "concurrency_1_req_rate_inf_gpus_2.json"  # the baseline's client


def pid_dir() -> Path:
    d = Path(os.environ["RUN_DIR"]) / "fakepids"
    d.mkdir(exist_ok=True)
    return d


def record_self(name: str, **extra: object) -> None:
    """$RUN_DIR/fakepids/<name>.<pid>.json: what a test needs to find this process again."""
    import psutil

    pid = os.getpid()
    info = {
        "name": name,
        "pid": pid,
        "create_time": psutil.Process(pid).create_time(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        **extra,
    }
    tmp = pid_dir() / f".{name}.{pid}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, pid_dir() / f"{name}.{pid}.json")


def set_comm(title: str) -> None:
    """What `ps`/psutil call the process name (Linux prctl PR_SET_NAME, 15 bytes at most)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, title.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def fork_worker(name: str) -> int:
    """A child like vLLM's engine worker: same process group, exits on SIGTERM and reports
    the CPU affinity it had then (the node runtime re-pins a worker's main thread)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        set_comm("VLLM::Worker")
        record_self(f"{name}-worker")

        def on_term(_signum, _frame):
            out = pid_dir() / f"{name}-worker.affinity"
            out.write_text(json.dumps(sorted(os.sched_getaffinity(0))))
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
        while True:
            time.sleep(0.2)
    finally:
        os._exit(0)


def fork_escapee(name: str) -> int:
    """A grandchild that leaves the server's session and process group and ignores SIGTERM:
    only a kill of the tree the supervisor collected with psutil reaches it."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        set_comm("fake-escapee")
        record_self(f"{name}-escapee")
        while True:
            time.sleep(0.2)
    finally:
        os._exit(0)


def make_handler(args: argparse.Namespace, state: dict):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *a: object) -> None:  # into the process's log file
            sys.stdout.write(f"{args.name}: {fmt % a}\n")
            sys.stdout.flush()

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                ready = not args.never_healthy and time.monotonic() >= state["ready_at"]
                self._send(200 if ready else 503, b"{}")
            elif self.path == "/metrics":
                text = (
                    f"# TYPE vllm:request_success_total counter\n"
                    f'vllm:request_success_total{{model_name="fake",server="{args.name}"}} '
                    f"{state['completions']}\n"
                )
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/completions":
                self._send(404, b'{"error": "not found"}')
                return
            if args.completion_status != 200:
                self._send(args.completion_status, b'{"error": {"message": "injected failure"}}')
                return
            state["completions"] += 1
            reply = {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "text": f" fake from {args.name}", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8},
            }
            self._send(200, json.dumps(reply).encode())

    return Handler


def run_server(args: argparse.Namespace) -> None:
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record_self(args.name, port=args.port)
    fork_worker(args.name)
    if args.escapee:
        fork_escapee(args.name)
    if args.exit_after is not None:
        time.sleep(args.exit_after)
        if args.crash_log:
            print(args.crash_log.replace("\\n", "\n"), flush=True)
        print(f"{args.name}: fake start-up failure, exiting with {args.exit_code}", flush=True)
        sys.exit(args.exit_code)
    state = {"ready_at": time.monotonic() + args.health_delay, "completions": 0}
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args, state))
    server.daemon_threads = True
    # A thread started before the node pins the server, like vLLM's API-server threads.
    helper = threading.Thread(target=lambda: threading.Event().wait(), name="helper", daemon=True)
    helper.start()

    def on_term(_signum: int, _frame: object) -> None:
        # The CPU affinity of the server's main thread and helper thread then (the node
        # runtime keeps a cpu_bind server's whole process tree on its cores).
        tids = {"main": threading.get_native_id(), "helper": helper.native_id}
        mine = {k: sorted(os.sched_getaffinity(t)) for k, t in tids.items()}
        (pid_dir() / f"{args.name}.affinity").write_text(json.dumps(mine))
        sys.exit(0)

    if not args.ignore_term:
        signal.signal(signal.SIGTERM, on_term)
    print(f"{args.name}: listening on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever(poll_interval=0.1)


def run_bench(args: argparse.Namespace) -> None:
    record_self("bench" if args.result_name == RESULT_NAME else "bench-aggregated")
    run_dir = Path(os.environ["RUN_DIR"])
    req = urllib.request.Request(
        f"http://127.0.0.1:{args.proxy_port}/v1/completions",
        data=json.dumps({"model": "fake", "prompt": "hi", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.time()
    with urllib.request.urlopen(req, timeout=5) as r:
        text = json.loads(r.read())["choices"][0]["text"]
    end = time.time()
    result = {
        "concurrency": 1,
        "max_concurrency": 1,
        "completed": 1,
        "failed": 0,
        "num_prompts": 1,
        "text": text,
        "partial": args.exit_code != 0,
        # The measured window and tokens, as pdbench bench writes them (power accounting reads them).
        "benchmark_start_time_unix": start,
        "benchmark_end_time_unix": end,
        "duration": end - start,
        "total_input_tokens": 1,
        "total_output_tokens": 4,
    }
    (run_dir / args.result_subdir / args.result_name).write_text(json.dumps(result))
    print(f"bench: wrote {args.result_name}", flush=True)
    if args.keep_on_sigint:

        def on_int(_signum, _frame):
            (run_dir / args.result_name).write_text(json.dumps(result | {"stop_reason": "interrupted"}))
            print("bench: SIGINT, wrote the point as interrupted", flush=True)
            sys.exit(130)

        signal.signal(signal.SIGINT, on_int)
    if args.kill_server:  # the server dies under the client, which fails at once: echo races cause
        for f in pid_dir().glob(f"{args.kill_server}.*.json"):
            os.kill(json.loads(f.read_text())["pid"], signal.SIGKILL)
    if args.sleep:
        time.sleep(args.sleep)
    sys.exit(args.exit_code)


def as_fake(kind: str, argv: list[str]) -> list[str]:
    """The fake's command line for a command line of the rendered server.sh."""
    spec = json.loads((Path(os.environ["RUN_DIR"]) / "fakes.json").read_text())
    ports, flags = spec["ports"], spec["flags"]
    if kind == "bench":
        config = argv[argv.index("--config") + 1]
        if config.endswith("bench-aggregated.json"):
            return ["bench", "--proxy-port", str(ports["proxy"]), "--result-name", AGGREGATED_RESULT_NAME]
        if Path(config).name.startswith("bench-arm-"):
            arm = Path(config).name.removeprefix("bench-arm-").removesuffix(".json")
            return ["bench", "--proxy-port", str(ports["proxy"]), "--result-subdir", f"arms/{arm}"]
        if Path(config).name.startswith("bench-workload-"):  # flags by its client's name: bench-workload-<w>
            workload = Path(config).name.removeprefix("bench-workload-").removesuffix(".json")
            subdir = ["--result-subdir", f"workloads/{workload}"]
            return ["bench", "--proxy-port", str(ports["proxy"]), *subdir, *flags.get(f"bench-workload-{workload}", [])]
        return ["bench", "--proxy-port", str(ports["proxy"]), *flags.get("bench", [])]
    port = int(argv[argv.index("--port") + 1])
    name = next(n for n, p in ports.items() if p == port)
    return ["server", "--name", name, "--port", str(port), *flags.get(name, [])]


def write_bin(bin_dir: Path) -> Path:
    """`vllm` and `python` wrappers in bin_dir; `python -m harness proxy|bench` and `vllm`
    become fakes, anything else runs the real interpreter. Returns the `python` wrapper,
    for PDBENCH_PYTHON (the local launcher puts its directory first on PATH)."""
    me, real = shlex.quote(str(Path(__file__).resolve())), shlex.quote(sys.executable)
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "vllm": f'exec {real} {me} as vllm "$@"\n',
        "python": (
            'if [ "${1:-}" = -m ] && [ "${2:-}" = harness ] && { [ "${3:-}" = proxy ] || [ "${3:-}" = bench ]; }; then\n'
            f'  exec {real} {me} as "$3" "${{@:4}}"\n'
            "fi\n"
            # vllm-router as a router arm: a fake proxy on its port.
            'if [ "${1:-}" = -m ] && [ "${2:-}" = vllm_router.launch_router ]; then\n'
            f'  exec {real} {me} as proxy "${{@:3}}"\n'
            "fi\n"
            f'exec {real} "$@"\n'
        ),
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir / "python"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["as"]:
        argv = as_fake(argv[1], argv[2:])
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--name", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--health-delay", type=float, default=0.0)
    s.add_argument("--never-healthy", action="store_true")
    s.add_argument("--exit-after", type=float)
    s.add_argument("--exit-code", type=int, default=3)
    s.add_argument("--crash-log", help="lines (\\n-separated) printed before the --exit-after exit")
    s.add_argument("--ignore-term", action="store_true")
    s.add_argument("--escapee", action="store_true")
    s.add_argument("--completion-status", type=int, default=200)
    b = sub.add_parser("bench")
    b.add_argument("--proxy-port", type=int, required=True)
    b.add_argument("--exit-code", type=int, default=0)
    b.add_argument("--sleep", type=float, default=0.0)
    b.add_argument("--kill-server", help="SIGKILL this fake server, then exit with --exit-code")
    b.add_argument(
        "--keep-on-sigint",
        action="store_true",
        help="as pdbench bench on Ctrl-C: write the result as interrupted, exit 130",
    )
    b.add_argument("--result-name", default=RESULT_NAME)
    b.add_argument(
        "--result-subdir",
        default=".",
        help="a router arm's or workload's folder in the run (arms/<arm>, workloads/<w>)",
    )
    args = ap.parse_args(argv)
    (run_server if args.cmd == "server" else run_bench)(args)


if __name__ == "__main__":
    main()
