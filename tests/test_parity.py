"""Parity with the vendors' own jobs (the seed: InferenceX's vLLM PD-disaggregation job on
MI355X with MoRI-IO, its NIXL era, vLLM's Mooncake flow), one row per setting, as
docs/parity.md lists them: a setting dropped from the rendered job fails its row."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from harness.config import load_recipe
from harness.render import RenderContext, render_job
from harness.render.commands import proxy_argv, server_env
from harness.topology import plan

CTX = RenderContext(run_dir="/shared/results/RUN", root="/opt/pdbench", python="/usr/bin/python3", git_commit=None)

# (row id, recipe, rendered file, text that must be there, how many times; None: at least once)
PARITY = [
    # MoRI-IO on MI355X (dsr1-fp8-mi355x-moriio-1p2d)
    ("moriio-all2all-flag", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", "--all2all-backend mori_low_latency", 2),
    ("moriio-no-removed-all2all-env", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", "VLLM_ALL2ALL_BACKEND", 0),
    ("moriio-read-mode-in-extra-config", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", '\\"read_mode\\":true', 3),
    (
        "moriio-no-ignored-read-mode-env",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "server.sh",
        "VLLM_MORIIO_CONNECTOR_READ_MODE",
        0,
    ),
    ("moriio-proxy-registration", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", '\\"proxy_ping_port\\":\\"36367\\"', 3),
    ("moriio-http-port", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", '\\"http_port\\":\\"2584\\"', 3),
    (
        "moriio-handshake-port-per-worker",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "server.sh",
        '\\"handshake_port\\":\\"5608\\"',
        1,
    ),
    ("moriio-notify-port-per-worker", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", '\\"notify_port\\":\\"61013\\"', 1),
    (
        "engine-ready-timeout",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "server.sh",
        "export VLLM_ENGINE_READY_TIMEOUT_S=3600\n",
        3,
    ),
    (
        "request-id-randomization-off",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "server.sh",
        "export VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1",
        3,
    ),
    ("ucx-log-level", "dsr1-fp8-mi355x-moriio-1p2d", "server.sh", "export UCX_LOG_LEVEL=warn\n", None),
    (
        "nic-detection-before-every-server",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "server.sh",
        'nic_env=$("$PDBENCH_PYTHON" -m harness nic',
        3,
    ),
    ("nicctl-mounted", "dsr1-fp8-mi355x-moriio-1p2d", "container.sh", '-v "$NICCTL:/usr/sbin/nicctl:ro"', 1),
    (
        "rdma-devices-and-memlock",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "container.sh",
        "--device /dev/infiniband --ulimit memlock=-1:-1",
        1,
    ),
    (
        "privileged-host-network-ipc",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "container.sh",
        "--network host --ipc host --privileged",
        1,
    ),
    (
        "no-bytecode-written-in-the-tree",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "container.sh",
        '-e PYTHONDONTWRITEBYTECODE=1 -e "PDBENCH_CONTAINER',
        1,
    ),
    ("no-pycache-prefix", "dsr1-fp8-mi355x-moriio-1p2d", "container.sh", "-e PYTHONPYCACHEPREFIX", 0),
    ("mori-package-in-the-image", "dsr1-fp8-mi355x-moriio-1p2d", "container.sh", "harness.bench.client, mori'", 1),
    # NIXL (dsr1-fp8-mi355x-nixl-1p2d)
    ("nixl-load-failure-policy", "dsr1-fp8-mi355x-nixl-1p2d", "server.sh", '"kv_load_failure_policy":"fail"', 3),
    ("nixl-side-channel-ports", "dsr1-fp8-mi355x-nixl-1p2d", "server.sh", "export VLLM_NIXL_SIDE_CHANNEL_PORT=", 3),
    ("nixl-side-channel-host-from-rdma", "dsr1-fp8-mi355x-nixl-1p2d", "server.sh", "VLLM_NIXL_SIDE_CHANNEL_HOST", 0),
    (
        "nixl-ucx-error-handling-none",
        "dsr1-fp8-mi355x-nixl-1p2d",
        "container.sh",
        'init["ucx_error_handling_mode"] = "none"',
        1,
    ),
    ("nixl-package-in-the-image", "dsr1-fp8-mi355x-nixl-1p2d", "container.sh", "harness.bench.client, nixl'", 1),
    ("nixl-ucx-log-level", "dsr1-fp8-mi355x-nixl-1p2d", "server.sh", "export UCX_LOG_LEVEL=warn\n", None),
    # Mooncake (dsr1-fp8-h200-mooncake-1p2d)
    (
        "mooncake-bootstrap-port",
        "dsr1-fp8-h200-mooncake-1p2d",
        "server.sh",
        "export VLLM_MOONCAKE_BOOTSTRAP_PORT=8998\n",
        1,
    ),
    ("mooncake-proxy-knows-the-port", "dsr1-fp8-h200-mooncake-1p2d", "server.sh", "--bootstrap-port 8998", 1),
    (
        "mooncake-package-set-up",
        "dsr1-fp8-h200-mooncake-1p2d",
        "container.sh",
        "pip install --no-cache-dir mooncake-transfer-engine",
        1,
    ),
    (
        "mooncake-package-in-the-image",
        "dsr1-fp8-h200-mooncake-1p2d",
        "container.sh",
        "harness.bench.client, mooncake.engine'",
        1,
    ),
]


@cache
def _rendered(recipe: str, tmp: str) -> Path:
    out = Path(tmp) / recipe
    out.mkdir(parents=True)
    render_job(load_recipe(recipe), out, CTX)
    return out


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("parity"))


@pytest.mark.parametrize("row, recipe, file, needle, count", PARITY, ids=[r[0] for r in PARITY])
def test_parity_row(row: str, recipe: str, file: str, needle: str, count: int | None, tmp: str) -> None:
    text = (_rendered(recipe, tmp) / file).read_text()
    found = text.count(needle)
    assert found == count if count is not None else found > 0, f"{row}: {needle!r} {found}x in {recipe}/{file}"


def test_every_row_is_in_the_docs() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "parity.md").read_text()
    missing = [row for row, *_ in PARITY if f"`{row}`" not in doc]
    assert not missing, f"rows of tests/test_parity.py missing from docs/parity.md: {missing}"


@pytest.mark.parametrize(
    "recipe", ["dsr1-fp8-mi355x-moriio-1p2d", "dsr1-fp8-mi355x-nixl-1p2d", "dsr1-fp8-h200-mooncake-1p2d"]
)
def test_the_seeds_sweep(recipe: str, tmp: str) -> None:
    bench = json.loads((_rendered(recipe, tmp) / "bench.json").read_text())
    assert (bench["isl"], bench["osl"], bench["range_ratio"]) == (8192, 1024, 0.8)
    assert bench["concurrency"] == [8, 16, 32, 64, 128, 256, 512] and bench["cooldown_s"] == 10
    assert (bench["prompts_multiplier"], bench["min_prompts"], bench["ignore_eos"]) == (10, 16, True)


def test_two_workers_on_a_node_get_their_own_moriio_ports() -> None:
    rr = load_recipe(
        "dsr1-fp8-mi355x-moriio-1p2d",
        ["topology.decode.nodes=1", "topology.decode.tp=4", "topology.decode.ep=4"],
    )
    p = plan(rr)
    decode = p.role("decode")
    assert [w.node for w in decode] == [1, 1]
    ranges = []
    for w in decode:
        extra = json.loads(json.dumps(_kv_extra(rr, w)))
        hs, nt = int(extra["handshake_port"]), int(extra["notify_port"])
        # vLLM binds base + dp_rank + tp_rank on each side: a range of tp ports per worker.
        ranges += [range(hs, hs + 4), range(nt, nt + 4)]
    taken = [port for r in ranges for port in r]
    assert len(taken) == len(set(taken)), ranges
    from harness.render.preflight_spec import preflight_spec

    spec = preflight_spec(rr, p, "/opt/pdbench")
    assert set(taken) <= set(spec.ports[1])  # every node's preflight checks them free


def test_two_prefills_on_a_node_get_their_own_mooncake_bootstrap_ports() -> None:
    rr = load_recipe("dsr1-fp8-h200-mooncake-1p2d", ["topology.prefill.workers=2", "topology.prefill.tp=4"])
    p = plan(rr)
    prefill = p.role("prefill")
    ports = [server_env(rr, w)["VLLM_MOONCAKE_BOOTSTRAP_PORT"] for w in prefill]
    assert [w.node for w in prefill] == [0, 0] and len(set(ports)) == 2, ports
    argv = [a if isinstance(a, str) else a.text for a in proxy_argv(rr, p)]
    told = [argv[i + 1] for i, a in enumerate(argv) if a == "--bootstrap-port"]
    assert told == ports  # in --prefill order
    assert all("VLLM_MOONCAKE_BOOTSTRAP_PORT" not in server_env(rr, w) for w in p.role("decode"))


def _kv_extra(rr, worker) -> dict:
    from harness.render.commands import concrete, kv_transfer_config

    return {
        k: concrete(v) if not isinstance(v, (bool, int)) else v
        for k, v in kv_transfer_config(rr, worker)["kv_connector_extra_config"].items()
    }
