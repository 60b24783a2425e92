"""Test doubles of the power sampler's sources, replaying fixed readings: an `nvidia-smi` and an
`amd-smi` for PATH, and a `pynvml` module for PYTHONPATH (only the calls the sampler makes)."""

from __future__ import annotations

import sys
from pathlib import Path

# The readings every fake source replays: (index, uuid, W).
GPUS = [(0, "GPU-aaaa", 100.5), (1, "GPU-bbbb", 200.25)]


def fake_bin(d: Path, name: str, body: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    exe = d / name
    exe.write_text(f"#!{sys.executable}\n" + body)
    exe.chmod(0o755)
    return d


FAKE_NVIDIA_SMI = f"""
import sys, time
gpus = {GPUS!r}
lms = [a for a in sys.argv[1:] if a.startswith("-lms")]
if not lms:
    for i, u, _ in gpus:
        print(f"{{i}}, {{u}}")
    sys.exit(0)
assert "--query-gpu=index,uuid,power.draw" in sys.argv, sys.argv
while True:
    for i, u, w in gpus:
        print(f"{{i}}, {{u}}, {{w:.2f}}", flush=True)
    time.sleep(int(lms[0].split("=")[1]) / 1000)
"""

FAKE_AMD_SMI = f"""
import json, sys
assert sys.argv[1:] == ["metric", "--power", "--json"], sys.argv
print(json.dumps([{{"gpu": i, "power": {{"socket_power": {{"value": w, "unit": "W"}}}}}} for i, _, w in {GPUS!r}]))
"""

# pynvml's calls the sampler makes, replaying the same readings; the energy counter in mJ grows.
FAKE_PYNVML = f"""
import time
GPUS = {GPUS!r}
class NVMLError(Exception):
    pass
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(GPUS)
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return GPUS[h][1].encode()
def nvmlDeviceGetPowerUsage(h): return int(GPUS[h][2] * 1000)
def nvmlDeviceGetTotalEnergyConsumption(h): return int(time.time() * GPUS[h][2] * 1000)
"""
