"""`connector.progress_thread: false`: vLLM's NIXL connectors built without NIXL's progress thread
(connector/nixl_polled.py), which otherwise polls UCX without pause and keeps a core busy per
engine (docs/predict.md)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from harness import kv_connectors
from harness.config import load_recipe
from harness.config.schema import ConnectorSpec
from harness.render.commands import kv_transfer_config
from harness.topology import plan

# In a process of its own: NIXL's agent with vLLM's config and with ours, and each agent's new
# threads' CPU time over an idle second. A busy thread left in a pytest worker would slow the rest.
THREAD_CPU = r"""
import json, os, time
from connector.nixl_polled import progress_thread_off
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from nixl._api import nixl_agent

def cpu(tid):
    f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def idle_cpu(name, config):
    before = set(os.listdir("/proc/self/task"))
    agent = nixl_agent(name, config)
    new = set(os.listdir("/proc/self/task")) - before
    start = {t: cpu(t) for t in new}
    time.sleep(1.0)
    return max(cpu(t) - start[t] for t in new)

# As vLLM 0.32's worker builds it (nixl/base_worker.py): the module's own binding.
vllms = idle_cpu("vllm", base_worker.nixl_agent_config(num_threads=4, capture_telemetry=True))
with progress_thread_off() as changed:
    config = base_worker.nixl_agent_config(num_threads=4, capture_telemetry=True)
ours = idle_cpu("ours", config)
print(json.dumps({"vllms": vllms, "ours": ours, "changed": changed,
                  "restored": base_worker.nixl_agent_config().enable_pthread}))
os._exit(0)  # vLLM's agent's thread spins on; no teardown to wait for
"""


def test_the_cpu_recipes_load_nixl_from_pdbench_module_and_others_do_not() -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", [], cluster="local")
    worker = plan(rr).role("decode")[0]
    assert rr.recipe.connector.progress_thread is False  # precondition: the recipe turns it off
    cfg = kv_transfer_config(rr, worker)
    assert (cfg["kv_connector"], cfg["kv_connector_module_path"]) == ("NixlConnector", "connector.nixl_polled")
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", ["connector.progress_thread=true"], cluster="local")
    assert "kv_connector_module_path" not in kv_transfer_config(rr, worker)
    gpu = load_recipe("llama8b-shape-bf16-h200x1-nixl-1p1d", [])
    assert "kv_connector_module_path" not in kv_transfer_config(gpu, plan(gpu).role("decode")[0])


def test_only_nixl_connectors_take_the_setting() -> None:
    with_module = {n for n in kv_connectors.kv_names() if kv_connectors.get(n).without_progress_thread}
    assert with_module == {"nixl", "nixlpush"}
    assert ConnectorSpec(name="nixl", progress_thread=False).progress_thread is False
    for name in sorted(set(kv_connectors.kv_names()) - with_module):
        assert ConnectorSpec(name=name).progress_thread  # precondition: valid with the default
        with pytest.raises(ValueError, match=f"progress_thread: false applies to nixl, nixlpush only, not the {name}"):
            ConnectorSpec(name=name, progress_thread=False)


def test_the_module_hands_vllm_its_own_classes_under_their_names() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    for name in ("nixl", "nixlpush"):
        entry = kv_connectors.get(name)
        assert entry.without_progress_thread and entry.vllm_class
        ours = getattr(importlib.import_module(entry.without_progress_thread), entry.vllm_class)
        vllms = KVConnectorFactory.get_connector_class_by_name(entry.vllm_class)
        assert ours is not vllms and issubclass(ours, vllms)


def test_vllms_agent_spins_a_thread_and_ours_does_not() -> None:
    proc = subprocess.run([sys.executable, "-c", THREAD_CPU], capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["changed"] >= 1 and out["restored"] is True
    # Precondition: vLLM's own agent has a thread that burns CPU while nothing is transferred
    # (about a whole core alone; a loaded 2-core machine gives it less).
    assert out["vllms"] > 0.15, out
    assert out["ours"] < 0.05, out
