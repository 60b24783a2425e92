"""The exact commands and environment of every process of a job, as shell words.

A word is either a literal (shell-quoted when rendered) or a Shell expression that
bash must expand at run time (a node address known only inside the job).
"""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import kv_connectors
from harness.config.benchmark import BenchmarkSettings
from harness.config.cpus import parse_groups
from harness.config.executor import as_run, catalogue_flags, replaces_catalogue_uni
from harness.config.load import ResolvedRecipe
from harness.config.schema import Flags
from harness.kv_connectors.entry import Setting, Value
from harness.rundir.paths import LOGS, PROXY_TIMINGS, SECRET, STATE, bench_config_name, metrics_subdir, sentinels_subdir
from harness.rundir.profile_summary import capture_dir
from harness.topology import JobPlan, Phase, Worker


@dataclass(frozen=True)
class Shell:
    """Text bash expands at run time; rendered inside double quotes."""

    text: str


Word = str | Shell

PYTHON = Shell("${PDBENCH_PYTHON}")
RUN_DIR = Shell("${RUN_DIR}")
NODE_ADDR = Shell("${PDBENCH_NODE_ADDR}")


def node_addr(node: int) -> Shell:
    return Shell(f"${{PDBENCH_NODE_{node}_ADDR}}")


def quote(word: Word) -> str:
    if isinstance(word, Shell):
        return f'"{word.text}"'
    return shlex.quote(word)


def flag_words(flags: Flags) -> list[str]:
    """{'enforce-eager': True, 'dtype': 'float32'} -> ['--enforce-eager', '--dtype', 'float32']."""
    words: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        words.append(f"--{key}")
        if value is True:
            continue
        if isinstance(value, (dict, list)):
            words.append(json.dumps(value, separators=(",", ":")))
        else:
            words.append(str(value))
    return words


def job_value(rr: ResolvedRecipe, value: Value, worker: Worker | None = None) -> Word | int | bool | None:
    """A value a connector's entry names, for one worker (None: the key is left out)."""
    c = rr.recipe.connector
    if value is Value.PROXY_PING_PORT:
        return c.proxy_ping_port
    if value is Value.READ_MODE:
        return True if c.read_mode else None
    if value is Value.NODE_ADDR:
        return NODE_ADDR
    if value is Value.PROXY_ADDR:
        return node_addr(0)  # the proxy's node, whose address is known only in the job
    if value is Value.SECRET_FILE:
        return Shell(f"${{RUN_DIR}}/{SECRET}")
    if value is Value.TIMINGS_DIR:
        return Shell(f"${{RUN_DIR}}/{PROXY_TIMINGS}")
    assert worker is not None, f"{value} is a worker's"
    if value is Value.HTTP_PORT:
        return worker.port
    if value is Value.SIDE_CHANNEL_PORT:
        return worker.side_channel_port
    if value is Value.NOTIFY_PORT:
        return notify_port(rr, worker)
    raise AssertionError(f"no value for {value}")


def _setting(rr: ResolvedRecipe, setting: Setting, worker: Worker) -> Word | int | bool | None:
    value = job_value(rr, setting.value, worker)
    return str(value) if setting.text and isinstance(value, int) else value


def kv_transfer_config(rr: ResolvedRecipe, worker: Worker) -> dict[str, Any]:
    c = rr.recipe.connector
    entry = kv_connectors.get_kv(c.name)
    cfg: dict[str, Any] = {
        "kv_connector": entry.vllm_class,
        "kv_role": "kv_producer" if worker.role == "prefill" else "kv_consumer",
    }
    if c.kv_buffer_device:
        cfg["kv_buffer_device"] = c.kv_buffer_device
    cfg.update({str(k): v for k, v in c.transfer_config.items()})
    if entry.module_path:
        cfg["kv_connector_module_path"] = entry.module_path
    if not c.progress_thread:  # config checked that the entry has the module
        cfg["kv_connector_module_path"] = entry.without_progress_thread
    # The entry's defaults, after the recipe's own keys.
    extra = dict(c.extra_config)
    for key, setting in entry.extra_config.items():
        value = _setting(rr, setting, worker)
        if value is not None:
            extra.setdefault(key, value)
    if extra:
        cfg["kv_connector_extra_config"] = extra
    return cfg


def storage_env(rr: ResolvedRecipe) -> dict[str, Word]:
    """Every process of the job reads weights and tokenizer from local storage, never the hub."""
    env: dict[str, Word] = {}
    if rr.recipe.site.hf_cache:
        env["HF_HUB_CACHE"] = rr.recipe.site.hf_cache
    if rr.weights_local:
        # A job that downloads at start-up pulls ~700 GB per node into a throw-away container.
        env["HF_HUB_OFFLINE"] = "1"
    return env


def storage_mounts(rr: ResolvedRecipe, root: str) -> dict[str, str]:
    """Host path -> container path:ro for the weights, the tokenizer and the HF cache, where
    they are outside the pdbench tree (mounted already)."""
    site, out = rr.recipe.site, dict[str, str]()
    paths = [site.model_root] if site.model_root else []
    if rr.model.path is not None:
        paths.append(rr.relocated(rr.model_source, root))
    if rr.model.tokenizer and Path(rr.tokenizer).is_absolute():
        paths.append(rr.relocated(rr.tokenizer, root))
    if site.hf_cache:
        paths.append(site.hf_cache)
    for path in paths:
        inside = [q for q in (root, *out) if path == q or path.startswith(q.rstrip("/") + "/")]
        if path and not inside:
            out[path] = f"{path}:ro"
    return out


def notify_port(rr: ResolvedRecipe, worker: Worker) -> int:
    """The worker's notify base: connector.notify_port, offset as its side-channel base is."""
    c = rr.recipe.connector
    return c.notify_port + (worker.side_channel_port - c.side_channel_port)


def server_env(rr: ResolvedRecipe, worker: Worker) -> dict[str, Word]:
    """Environment of one vLLM server, later keys winning: the connector's defaults, model, role,
    recipe, topology, then the connector's job values."""
    role = getattr(rr.recipe.topology, worker.role)
    kv = kv_connectors.get_kv(rr.recipe.connector.name)
    env: dict[str, Word] = dict(kv.env_defaults) if worker.role in ("prefill", "decode") else {}
    env.update(model_role_env(rr, worker.role))
    env.update(rr.recipe.env)
    env.update(role.env)
    nic_detection = rr.recipe.topology.nic_detection
    for var in kv.env:
        # With detection, `pdbench nic` sets the variable (the RDMA interface's address, say).
        if worker.role in var.roles and not (var.set_by_nic_detection and nic_detection):
            value = _setting(rr, var.setting, worker)
            if value is not None:
                env[var.name] = value if isinstance(value, (str, Shell)) else str(value)
    if worker.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = worker.visible_devices
        env["HIP_VISIBLE_DEVICES"] = worker.visible_devices
    if worker.cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = worker.cpu_bind
        # A thread per core of a rank's group, unless set above. vLLM's multiprocessing executor sets
        # it itself; in one engine process (`distributed-executor-backend: uni`, models.yaml's CPU
        # models) torch keeps a thread per core of the machine, and once the node pins the server to
        # its group those threads spin against each other (a tiny-llama decode's TPOT: 331 ms,
        # against about 2 ms with one thread).
        env.setdefault("OMP_NUM_THREADS", omp_threads(worker.cpu_bind))
    return env


def omp_threads(cpu_bind: str) -> str:
    """OMP_NUM_THREADS of a pinned CPU server: one per core of its first rank's group."""
    return str(len(parse_groups(cpu_bind)[0]))


def model_role_env(rr: ResolvedRecipe, role: str) -> dict[str, str]:
    """The model's environment for one role: its env, then the role's (aggregated servers default
    to decode's), as the role's executor runs it (harness.config.executor)."""
    m = rr.model
    if role == "prefill":
        own = m.prefill_env
    else:
        own = m.aggregated_env if role == "aggregated" and m.aggregated_env is not None else m.decode_env
    return as_run({}, {**m.env, **own}, replaces_catalogue_uni(rr, role))[1]


def model_role_flags(rr: ResolvedRecipe, role: str) -> dict[str, Any]:
    """The model's `vllm serve` flags for one role (aggregated servers default to decode's), its
    one-process `uni` executor as `mp` where the role's servers have more than one rank."""
    return as_run(catalogue_flags(rr, role), {}, replaces_catalogue_uni(rr, role))[0]


def server_argv(rr: ResolvedRecipe, worker: Worker, root: str | None = None, rank: int = 0) -> list[Word]:
    """The `vllm serve` line of a worker's process on its rank-th node (0: the HTTP leader)."""
    role = getattr(rr.recipe.topology, worker.role)
    model_flags = model_role_flags(rr, worker.role)
    argv: list[Word] = [
        "vllm",
        "serve",
        rr.relocated(rr.model_source, root),
        "--port",
        str(worker.port),
        "--served-model-name",
        rr.served_model_name,
        "--max-model-len",
        str(rr.model.max_model_len),
        "--tensor-parallel-size",
        str(role.tp),
    ]
    if role.dp > 1:
        argv += ["--data-parallel-size", str(role.dp)]
    argv += _span_flags(rr, worker, rank)
    if role.ep > 1:
        argv += ["--enable-expert-parallel"]
    argv += flag_words({**model_flags, **role.flags})
    if role.kv_transfer and worker.role != "aggregated":
        argv += ["--kv-transfer-config", json_word(kv_transfer_config(rr, worker))]
    profile = rr.recipe.benchmark.profile
    if profile is None or worker.role not in profile.roles:
        return argv
    argv += ["--profiler-config", json_word(profiler_config(rr, worker))]
    return nsys_prefix(rr, worker, rank) + argv if profile.tool == "nsys" else argv


def profiler_config(rr: ResolvedRecipe, worker: Worker) -> dict[str, Any]:
    """vLLM's --profiler-config of a profiled worker: torch traces into its capture directory, or
    cuda (cudaProfilerStart/Stop, the capture range of the nsys around it)."""
    profile = rr.recipe.benchmark.profile
    assert profile is not None
    if profile.tool == "nsys":
        return {"profiler": "cuda", **profile.profiler_config}
    where = Shell(f"${{RUN_DIR}}/{capture_dir(worker.name)}")
    return {"profiler": "torch", "torch_profiler_dir": where, **profile.profiler_config}


def nsys_prefix(rr: ResolvedRecipe, worker: Worker, rank: int) -> list[Word]:
    """`nsys profile` around a worker's server on one node, as NVIDIA/srt-slurm wraps its workers:
    CUDA and NVTX, CUDA graphs per node, capturing only between cudaProfilerStart and Stop, which
    vLLM's cuda profiler calls on /start_profile and /stop_profile. `repeat`: one report per
    profiled window (numbered by nsys), each point's; the engine's workers are forked children."""
    profile = rr.recipe.benchmark.profile
    assert profile is not None
    where = Shell(f"${{RUN_DIR}}/{capture_dir(worker.name)}")
    return [
        # The capture directory first: nsys writes into -o's directory but does not make it.
        "sh",
        "-c",
        'mkdir -p "$0" && exec "$@"',
        where,
        "nsys",
        "profile",
        "-t",
        "cuda,nvtx",
        "--cuda-graph-trace=node",
        "--trace-fork-before-exec=true",
        "-c",
        "cudaProfilerApi",
        "--capture-range-end",
        "repeat",
        "--force-overwrite",
        "true",
        *profile.nsys_args,
        "-o",
        Shell(f"{where.text}/{worker.process_name(rank)}"),
    ]


def _span_flags(rr: ResolvedRecipe, worker: Worker, rank: int) -> list[Word]:
    """vLLM's multi-node flags for a worker spanning several nodes; followers run headless."""
    if worker.span == "single":
        return []
    leader = node_addr(worker.node)
    # Distinct per worker, so two leaders never collide even when they share a host.
    port = 13345 + worker.index + {"prefill": 0, "decode": 100, "aggregated": 200}[worker.role]
    if worker.span == "data_parallel":
        role = getattr(rr.recipe.topology, worker.role)
        local = rr.recipe.topology.gpus_per_node // role.tp
        flags: list[Word] = [
            "--data-parallel-size-local",
            str(local),
            "--data-parallel-address",
            leader,
            "--data-parallel-rpc-port",
            str(port),
        ]
        if rank:
            flags += ["--data-parallel-start-rank", str(rank * local), "--headless"]
        return flags
    flags = [
        "--nnodes",
        str(len(worker.nodes)),
        "--node-rank",
        str(rank),
        "--master-addr",
        leader,
        "--master-port",
        str(port),
    ]
    return flags + (["--headless"] if rank else [])


def json_word(obj: Any) -> Word:
    """Compact JSON; when it holds Shell values, a double-quoted word that bash expands."""
    shells: list[Shell] = []
    # A fresh token, so that no recipe string can spell a placeholder and be replaced.
    token = secrets.token_hex(8)

    def default(o: Any) -> str:
        if isinstance(o, Shell):
            shells.append(o)
            return f"@@{token}.{len(shells) - 1}@@"
        raise TypeError(f"not JSON serialisable: {o!r}")

    text = json.dumps(obj, separators=(",", ":"), default=default)
    if not shells:
        return text
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    for i, sh in enumerate(shells):
        text = text.replace(f"@@{token}.{i}@@", sh.text)
    return Shell(text)


def proxy_argv(rr: ResolvedRecipe, plan: JobPlan, phase: Phase = "disagg") -> list[Word]:
    p, c = rr.recipe.proxy, rr.recipe.connector
    use = kv_connectors.get_kv(c.name).proxy
    if phase == "aggregated":
        # The baseline: the same proxy, forwarding each request whole to one instance.
        words: list[Word] = [PYTHON, "-m", "harness", "proxy", "--host", "127.0.0.1", "--port", str(p.port)]
        words += ["--connector", kv_connectors.NONE.name, "--policy", p.policy]
        if p.workers > 1:
            words += ["--workers", str(p.workers)]
        words += ["--request-timeout-s", f"{p.request_timeout_s:g}"]
        words += ["--stream-idle-timeout-s", f"{p.stream_idle_timeout_s:g}"]
        words += ["--timings-dir", Shell(f"${{RUN_DIR}}/{PROXY_TIMINGS}")]
        for w in plan.role("aggregated"):
            words += ["--aggregated", Shell(f"http://{node_addr(w.node).text}:{w.port}")]
        return words
    # Only the benchmark client and node 0's health gate, both on the proxy's node, use
    # its HTTP port: loopback, not every interface.
    argv: list[Word] = [
        PYTHON,
        "-m",
        "harness",
        "proxy",
        "--host",
        "127.0.0.1",
        "--port",
        str(p.port),
        "--connector",
        c.name,
        "--policy",
        p.policy,
        "--request-timeout-s",
        f"{p.request_timeout_s:g}",
        "--stream-idle-timeout-s",
        f"{p.stream_idle_timeout_s:g}",
        # Each request's timings, which the benchmark client turns into the TTFT breakdown.
        "--timings-dir",
        Shell(f"${{RUN_DIR}}/{PROXY_TIMINGS}"),
    ]
    if p.workers > 1:
        argv += ["--workers", str(p.workers)]
    if p.overlap:
        argv += ["--overlap"]
    if use.instances == "registered":
        # MoRI-IO servers register themselves on the proxy's ZMQ port (proxy_ping_port in
        # their kv-transfer-config) with the handshake/notify ports and DP/TP sizes the
        # flow needs; a static URL carries none of that, so none is passed. The proxy
        # instead waits for this many registered (and healthy) instances of each role.
        # Workers on every node register, so it binds the node's address (their proxy_ip).
        argv += [
            "--moriio-host",
            NODE_ADDR,
            "--moriio-port",
            str(c.proxy_ping_port),
            "--moriio-mode",
            "read" if c.read_mode else "write",
            "--expected-prefill",
            str(len(plan.role("prefill"))),
            "--expected-decode",
            str(len(plan.role("decode"))),
        ]
        return argv
    # Static instances, one per worker (its HTTP leader); the proxy expects all of them.
    for w in plan.role("prefill") + plan.role("decode"):
        argv += [f"--{w.role}", Shell(f"http://{node_addr(w.node).text}:{w.port}")]
    if use.bootstrap_port is not None:
        # Each prefill's bootstrap server (Mooncake's VLLM_MOONCAKE_BOOTSTRAP_PORT), in --prefill order.
        for w in plan.role("prefill"):
            argv += ["--bootstrap-port", str(w.side_channel_port)]
    return argv


def bench_argv(plan: JobPlan, phase: Phase = "disagg") -> list[Word]:
    argv: list[Word] = [
        PYTHON,
        "-m",
        "harness",
        "bench",
        "--config",
        Shell(f"${{RUN_DIR}}/{bench_config_name(phase)}"),
        "--results-dir",
        RUN_DIR,
    ]
    # Every HTTP server's /metrics around each point: the evidence for the point's validity.
    for w in (w for w in plan.workers if w.phase == phase):
        argv += ["--scrape", Shell(f"{w.name}={w.role}@http://{node_addr(w.node).text}:{w.port}")]
    return argv


def bench_argv_into(plan: JobPlan, config_name: str, subdir: str) -> list[Word]:
    """The disaggregated client's line reading `config_name` and writing into RUN_DIR/`subdir`
    (a router arm's or a workload's folder): the same servers scraped, the same flags."""
    swap = {
        f"${{RUN_DIR}}/{bench_config_name('disagg')}": Shell(f"${{RUN_DIR}}/{config_name}"),
        "${RUN_DIR}": Shell(f"${{RUN_DIR}}/{subdir}"),
    }
    return [swap.get(w.text, w) if isinstance(w, Shell) else w for w in bench_argv(plan, "disagg")]


def bench_config_into_subdir(cfg: dict[str, Any], proxy_timings: bool) -> dict[str, Any]:
    """`cfg` for a client that writes one folder down (bench_argv_into's): the job's logs, state
    and, where it keeps them (`proxy_timings`), the proxy's timings are back at the run directory."""
    up = "../../"
    return cfg | {
        "proxy_timings_dir": up + PROXY_TIMINGS if proxy_timings else None,
        "server_logs_dir": up + LOGS,
        "runtime_records_dir": up + STATE,
    }


def bench_config(
    rr: ResolvedRecipe,
    plan: JobPlan,
    run_meta: dict[str, Any],
    root: str | None = None,
    benchmark: BenchmarkSettings | None = None,
) -> dict[str, Any]:
    """The ClientConfig the job's client reads (its bench_config_name); the result dir is given at run time.
    `benchmark`: other settings than the recipe's own (a workload's, benchmark.workloads)."""
    # Every benchmark setting of the recipe, as the recipe holds it; then the job's bindings.
    # (Through model_dump_json: strict JSON, an infinite request_rate written as "Infinity".)
    settings = json.loads((benchmark or rr.recipe.benchmark).model_dump_json(exclude={"workloads"}))
    return settings | {
        "base_url": f"http://127.0.0.1:{rr.recipe.proxy.port}",
        "model": rr.served_model_name,
        "tokenizer": rr.relocated(rr.tokenizer, root),
        "result_dir": ".",
        "prefill_gpus": plan.devices("prefill"),
        "decode_gpus": plan.devices("decode"),
        # vllm-router writes no per-request timings: no TTFT breakdown rather than an empty one.
        "proxy_timings_dir": PROXY_TIMINGS if rr.recipe.proxy.kind == "pdbench" else None,
        "server_logs_dir": LOGS,
        "runtime_records_dir": STATE,
        "kv_connector": rr.recipe.connector.name,
        "metadata": run_meta,
    }


def aggregated_bench_config(
    rr: ResolvedRecipe, plan: JobPlan, run_meta: dict[str, Any], root: str | None = None
) -> dict[str, Any]:
    """The baseline's client config: the same settings and seed (so the same prompts), the
    GPU count of one aggregated deployment, and its own /metrics directory."""
    cfg = bench_config(rr, plan, run_meta, root)
    del cfg["prefill_gpus"], cfg["decode_gpus"], cfg["kv_connector"]
    return cfg | {
        "gpus": plan.devices("aggregated"),
        "metrics_dir": metrics_subdir("aggregated"),
        "sentinels_dir": sentinels_subdir("aggregated"),
    }


# Stand-ins for what only the job knows, so that a rendered line can be parsed ahead of time.
_SAMPLE_ENV = {"PDBENCH_NODE_ADDR": "10.0.0.1", "RUN_DIR": "/run", "PDBENCH_PYTHON": "python3"}


def concrete(word: Word) -> str:
    """A word as bash would pass it, with sample values for the job's run-time variables."""
    if isinstance(word, str):
        return word
    out, text, i = [], word.text, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in '\\"$`':
            out.append(text[i + 1])
            i += 2
        elif text.startswith("${", i):
            end = text.index("}", i)
            name = text[i + 2 : end]
            out.append(_SAMPLE_ENV.get(name, "10.0.0.1" if name.endswith("_ADDR") else name))
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def serve_lines(rr: ResolvedRecipe, plan: JobPlan) -> list[tuple[str, list[str], dict[str, str]]]:
    """Every distinct `vllm serve` line of the job: (process, the words after `vllm serve`,
    flag -> the recipe key that produced it, as 'FILE: KEY')."""
    from harness.config.load import source_of_key

    models = rr.models_file.name
    out, seen = [], set()
    for w in plan.workers:
        role = w.role
        origins = {
            "--max-model-len": f"{models}: models.{rr.recipe.model}.max_model_len",
            "--served-model-name": f"{models}: models.{rr.recipe.model}.served_model_name",
            "--tensor-parallel-size": f"topology.{role}.tp",
            "--data-parallel-size": f"topology.{role}.dp",
            "--enable-expert-parallel": f"topology.{role}.ep",
            "--port": f"topology.{role}.port",
            "--kv-transfer-config": "connector",
            "--profiler-config": "benchmark.profile",
        }
        flags_key = role if role != "aggregated" or rr.model.aggregated_flags is not None else "decode"
        for key in model_role_flags(rr, role):
            origins[f"--{key}"] = f"{models}: models.{rr.recipe.model}.{flags_key}_flags.{key}"
        for key in getattr(rr.recipe.topology, role).flags:
            origins[f"--{key}"] = f"topology.{role}.flags.{key}"
        for flag, key in origins.items():
            if not key.startswith(models):
                src = source_of_key(rr.provenance, key) or str(rr.recipe_file.name)
                src = rr.blame(key) if src == "--set" else src  # `--set KEY`, as the user typed it
                origins[flag] = src if src == f"--set {key}" else f"{src}: {key}"
        for rank, _node in enumerate(w.nodes):
            words = [concrete(x) for x in server_argv(rr, w, None, rank)]
            argv = words[words.index("serve") + 1 :]  # past `vllm serve` (and an nsys around it)
            if tuple(argv) not in seen:
                seen.add(tuple(argv))
                out.append((w.process_name(rank), argv, origins))
    return out
