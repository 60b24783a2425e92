"""vllm-router as the job's PD router (proxy.kind: vllm-router): its command line, and that
line through vllm-router's own argument parser where the package is importable here.

It runs in the job's Python (`python -m vllm_router.launch_router`), so the version that ran is
the one the node records. Per connector (the table's `vllm_router` entry): NIXL and Mooncake name
every prefill and decode by URL (Mooncake with each prefill's bootstrap port); MoRI-IO's workers
register on the router's ZMQ discovery address (connector.proxy_ping_port, the port their
kv-transfer-config names). The aggregated baseline runs it in its regular mode over the same
servers. It binds its HTTP port only once every named worker answers /health, so node 0's health
gate on its /health holds until then; it waits as long as the job's health bound.
"""

from __future__ import annotations

import argparse
import contextlib
import io

from harness import kv_connectors
from harness.config.load import ResolvedRecipe
from harness.render.commands import NODE_ADDR, PYTHON, Shell, Word, concrete, node_addr
from harness.topology import JobPlan, Phase

MODULE = "vllm_router.launch_router"


def router_argv(rr: ResolvedRecipe, plan: JobPlan, phase: Phase = "disagg") -> list[Word]:
    p, c, t = rr.recipe.proxy, rr.recipe.connector, rr.recipe.timeouts
    argv: list[Word] = [PYTHON, "-m", MODULE, "--host", "127.0.0.1", "--port", str(p.port)]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(p.router_metrics_port)]
    argv += ["--policy", p.policy, "--request-timeout-secs", str(max(1, round(p.request_timeout_s)))]
    # Workers start together with it: poll each second for as long as the job's health gate allows.
    argv += ["--worker-startup-timeout-secs", str(max(1, round(t.health_s))), "--worker-startup-check-interval", "1"]
    # A failed request is a failure of the point, never retried out of sight; per-request log
    # lines at info would cost CPU on the client's node.
    argv += ["--disable-retries", "--log-level", "warning"]
    if phase == "aggregated":
        argv += [
            "--worker-urls",
            *(Shell(f"http://{node_addr(w.node).text}:{w.port}") for w in plan.role("aggregated")),
        ]
        return argv
    use = kv_connectors.get_kv(c.name).vllm_router
    assert use is not None, f"validate refuses vllm-router with {c.name}"
    argv += ["--vllm-pd-disaggregation", "--kv-connector", use.kv_connector]
    if use.discovery:
        # Workers on every node register, so it binds the node's address (their proxy_ip).
        argv += ["--vllm-discovery-address", Shell(f"{NODE_ADDR.text}:{c.proxy_ping_port}")]
        return argv
    bootstrap = kv_connectors.get_kv(c.name).proxy.bootstrap_port is not None
    for w in plan.role("prefill"):
        argv += ["--prefill", Shell(f"http://{node_addr(w.node).text}:{w.port}")]
        if bootstrap:  # Mooncake's bootstrap server on the prefill's HTTP leader
            argv.append(str(w.side_channel_port))
    for w in plan.role("decode"):
        argv += ["--decode", Shell(f"http://{node_addr(w.node).text}:{w.port}")]
    return argv


class RouterUnavailable(RuntimeError):
    pass


def check_argv(argv: list[Word]) -> list[str]:
    """What vllm-router's own parser and validation refuse in `argv` (past the module), with sample
    values for the job's run-time variables; RouterUnavailable when the package is not here."""
    try:
        from vllm_router.launch_router import parse_router_args
    except ImportError as e:
        raise RouterUnavailable(f"vllm-router is not importable here: {e}") from None
    words = [concrete(w) for w in argv]
    args = words[words.index(MODULE) + 1 :]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = parse_router_args(args)
        # What its launcher checks before it starts the router (mode, URLs); private, so optional.
        if callable(validate := getattr(parsed, "_validate_router_args", None)):
            validate()
    except SystemExit:
        return [err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "its parser exited"]
    except (ValueError, argparse.ArgumentError) as e:
        return [str(e)]
    return []
