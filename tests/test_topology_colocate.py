"""topology.colocate: every role on one node, and pdbench, not the recipe, places the servers on
its GPUs; the local launcher's one host: a role's workers on ports of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli_run import pdbench

from harness.config.load import ConfigError, load_recipe
from harness.render.preflight_spec import preflight_spec
from harness.topology import plan

BASE = "llama8b-shape-bf16-h200x2-nixl-1p1d"  # colocate: true, 2 GPUs, 1P1D, and its 2-replica baseline
# These tests change the disaggregated GPU count: the recipe's own baseline (2 GPUs) goes first.
NO_BASELINE = "topology.aggregated=null"


def _plan(*overrides: str, single_host: bool = False):
    return plan(load_recipe(BASE, [NO_BASELINE, *overrides]), single_host=single_host)


def test_1p2d_and_its_three_replicas_share_a_four_gpu_node() -> None:
    p = _plan(
        "topology.gpus_per_node=4",
        "topology.decode.workers=2",
        "topology.aggregated={workers: 3, port: 8300}",
    )
    assert p.num_nodes == 1 and {pr.node for pr in p.processes()} == {0}
    got = {w.name: (w.port, w.visible_devices) for w in p.workers}
    assert got == {
        # own GPU first, then the node's others: the KV's peer stays visible
        "prefill-0": (8100, "0,1,2,3"),
        "decode-0": (8200, "1,0,2,3"),
        "decode-1": (8201, "2,0,1,3"),
        # the baseline, after the disaggregated servers are gone: the same three GPUs, its own only
        "aggregated-0": (8300, "0"),
        "aggregated-1": (8301, "1"),
        "aggregated-2": (8302, "2"),
    }
    # Preflight checks the node for the most GPUs any one phase uses.
    rr = load_recipe(BASE, [NO_BASELINE, "topology.gpus_per_node=4", "topology.decode.workers=2"])
    assert preflight_spec(rr, plan(rr), ".").gpus == {0: 3}


def test_tensor_parallel_workers_get_consecutive_gpus() -> None:
    p = _plan("topology.gpus_per_node=4", "topology.prefill.tp=2", "topology.decode.workers=2")
    assert [(w.name, w.devices, w.visible_devices) for w in p.workers] == [
        ("prefill-0", 2, "0,1,2,3"),
        ("decode-0", 1, "2,0,1,3"),
        ("decode-1", 1, "3,0,1,2"),
    ]


def test_a_placement_that_does_not_fit_names_the_workers_and_gpus() -> None:
    r = pdbench(
        "validate",
        BASE,
        "--skip-flag-check",
        *("--set", NO_BASELINE, "--set", "topology.prefill.tp=2", "--set", "topology.decode.workers=2"),
    )
    assert r.returncode == 2, r.stdout
    assert (
        "topology.colocate: on one node the disaggregated servers need 4 GPUs (prefill-0 2, decode-0 1, "
        "decode-1 1), but topology.gpus_per_node is 2"
    ) in r.stderr, r.stderr
    # (the baseline always fits once the disaggregated servers do: it must use as many GPUs)
    with pytest.raises(ConfigError, match="compare at the same GPU count"):
        _plan("topology.gpus_per_node=4", "topology.aggregated={workers: 3, port: 8300}")


def test_colocate_refuses_a_role_on_more_nodes() -> None:
    r = pdbench(
        "validate",
        BASE,
        "--skip-flag-check",
        *("--set", NO_BASELINE, "--set", "topology.decode.nodes=2", "--set", "topology.decode.workers=2"),
    )
    assert r.returncode == 2, r.stdout
    assert "colocate puts every role on one node: decode.nodes is 2; set it to 1" in r.stderr, r.stderr


def test_the_servers_are_told_their_gpus_in_server_sh(tmp_path: Path) -> None:
    r = pdbench(
        "render",
        BASE,
        "--out",
        str(tmp_path),
        "--skip-flag-check",
        *("--set", NO_BASELINE),
        "--set",
        "topology.gpus_per_node=4",
        "--set",
        "topology.decode.workers=2",
    )
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "server.sh").read_text()
    for proc, visible in (("prefill_0", "0,1,2,3"), ("decode_0", "1,0,2,3"), ("decode_1", "2,0,1,3")):
        body = script.split(f"proc_{proc}() {{\n", 1)[1].split("\n}\n", 1)[0]
        assert f"export CUDA_VISIBLE_DEVICES={visible}\n" in body + "\n", body


def test_one_host_gives_a_roles_workers_their_own_ports() -> None:
    # 2P2D and its baseline under the local launcher: on Slurm each node's first worker takes
    # the role's port; on one host they would all collide.
    sets = [
        "topology.prefill.workers=2",
        "topology.prefill.nodes=2",
        "topology.decode.workers=2",
        "topology.decode.nodes=2",
        "topology.aggregated={workers: 4, nodes: 4, port: 8300}",
    ]
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", sets)
    on_slurm = {w.name: w.port for w in plan(rr).workers}
    assert on_slurm["decode-0"] == on_slurm["decode-1"] == 8200
    one_host = {w.name: w.port for w in plan(rr, single_host=True).workers}
    assert one_host == {
        "prefill-0": 8100,
        "prefill-1": 8101,
        "decode-0": 8200,
        "decode-1": 8201,
        "aggregated-0": 8300,
        "aggregated-1": 8301,
        "aggregated-2": 8302,
        "aggregated-3": 8303,
    }


def test_validate_says_an_aggregated_only_job_serves_only_its_instances() -> None:
    r = pdbench(
        "validate",
        "tiny-fp32-cpu-nixl-1p2d-vs-agg",
        *("--cluster", "local", "--skip-flag-check", "--set", "topology.aggregated_only=true"),
    )
    assert r.returncode == 0, r.stderr
    assert "model tiny-llama, 3 aggregated instance(s) on 3 node(s), launcher slurm" in r.stdout, r.stdout


def test_an_aggregated_only_job_places_only_the_servers_it_starts() -> None:
    # One instance on a one-GPU node: its prefill and decode (never started) take no GPU.
    rr = load_recipe("llama8b-shape-bf16-h200x1-none-agg")
    assert rr.recipe.topology.aggregated_only and rr.recipe.topology.gpus_per_node == 1
    p = plan(rr)
    assert p.num_nodes == 1
    assert [(w.name, w.visible_devices) for w in p.workers if w.phase == "aggregated"] == [("aggregated-0", "0")]
    assert {w.name for w in p.workers if w.phase == "disagg" and w.visible_devices is not None} == set()
    # ...but the servers it does start must fit.
    with pytest.raises(ConfigError, match=r"topology.aggregated: 2 worker\(s\) per node x tp\*dp 1 needs 2 GPUs"):
        plan(load_recipe("llama8b-shape-bf16-h200x1-none-agg", ["topology.aggregated.workers=2"]))
