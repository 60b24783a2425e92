"""A node's GPU power sampler: every GPU's board power (and energy counter where the GPU keeps
one), ticked through the whole phase, appended to the run directory (harness.rundir.power_samples).

The node runtime starts it with each phase's processes and stops it with them (it is supervised
and reaped like them; its exit never fails the job: a sampler that stops leaves a gap, and the
points after it are judged by that gap). `--selftest S` samples for S seconds and prints what it
reads, or `missing: <reason>`, for checking a machine by hand.

Which source, in order:
1. NVML through `pynvml` (nvidia-ml-py), where importable: one library call per GPU per tick,
   no process spawned, and the GPU's own energy counter (nvmlDeviceGetTotalEnergyConsumption,
   mJ since the driver loaded) beside the power reading. nvmlDeviceGetPowerUsage is what DCGM
   reports as DCGM_FI_DEV_POWER_USAGE, the metric InferenceX integrates.
2. `nvidia-smi --query-gpu=... -lms`: the same reading from one long-lived process that ticks
   on its own (no spawn per tick); each line is stamped when read. No energy counter.
3. `amd-smi metric --power --json` on AMD GPUs, one bounded call per tick (it takes longer
   than a tick of NVML: its interval is at least AMD_MIN_INTERVAL_S).
None of them: the record says missing, with every source's reason, and nothing is sampled.

Timestamps are time.time() on this node: the wall clock the benchmark client (on node 0) stamps
its window with; nodes of one job keep their clocks in step through NTP, as Slurm clusters do.
GPU indices are the driver's (NVML's, PCI order), the order CUDA's are in under
CUDA_DEVICE_ORDER=PCI_BUS_ID and on nodes of identical GPUs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Protocol

from harness.rundir import RunDir
from harness.rundir.power_samples import DEFAULT_INTERVAL_S, Backend, Sample, SamplerRecord, append, write_record

log = logging.getLogger(__name__)

AMD_MIN_INTERVAL_S = 1.0
CALL_TIMEOUT_S = 5.0  # one nvidia-smi/amd-smi call or one tick's lines
NICE = 10  # below the servers and the client on a shared CPU


class Unavailable(Exception):
    """This source cannot sample here; the message says why."""


class Source(Protocol):
    backend: Backend
    source_metric: str
    paced: bool  # it ticks on its own (nvidia-smi -lms); otherwise the loop sleeps the interval

    def read(self) -> list[tuple[int, str, float | None, float | None, float]]:
        """One tick: (index, uuid, watts or None when not reported, joules or None, time.time())."""
        ...

    def close(self) -> None: ...


class Nvml:
    backend: Backend = "nvml"
    source_metric = "nvmlDeviceGetPowerUsage"
    paced = False

    def __init__(self) -> None:
        try:
            import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as e:
            raise Unavailable(f"pynvml is not importable in {sys.executable} ({e})") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise Unavailable(f"nvmlInit failed: {e}") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                raise Unavailable("NVML sees no GPU")
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in self.handles]
            pynvml.nvmlDeviceGetPowerUsage(self.handles[0])
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            raise Unavailable(f"NVML cannot read power: {e}") from None
        self.counter = []
        for h in self.handles:
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                self.counter.append(True)
            except pynvml.NVMLError:  # before Volta: no counter, the power reading still counts
                self.counter.append(False)

    def read(self) -> list[tuple[int, str, float | None, float | None, float]]:
        out = []
        for i, h in enumerate(self.handles):
            try:
                watts: float | None = self.nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            except self.nv.NVMLError:
                watts = None
            joules = None
            if self.counter[i]:
                try:
                    joules = self.nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
                except self.nv.NVMLError:
                    pass
            out.append((i, self.uuids[i], watts, joules, time.time()))
        return out

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


class NvidiaSmi:
    backend: Backend = "nvidia-smi"
    source_metric = "nvidia-smi power.draw"
    paced = True

    def __init__(self, interval_s: float) -> None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            raise Unavailable("nvidia-smi is not on PATH")
        try:
            listed = subprocess.run(
                [exe, "--query-gpu=index,uuid", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=CALL_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"nvidia-smi did not list the GPUs: {e}") from None
        if listed.returncode != 0:
            raise Unavailable(f"nvidia-smi exited with {listed.returncode}: {listed.stderr.strip()[-300:]}")
        self.gpus = [
            (int(i), u.strip()) for i, u in (line.split(",", 1) for line in listed.stdout.split("\n") if line.strip())
        ]
        if not self.gpus:
            raise Unavailable("nvidia-smi lists no GPU")
        self.proc = subprocess.Popen(
            [
                exe,
                "--query-gpu=index,uuid,power.draw",
                "--format=csv,noheader,nounits",
                f"-lms={max(1, round(interval_s * 1000))}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.pending = b""  # a line cut short at the end of the last read

    def read(self) -> list[tuple[int, str, float | None, float | None, float]]:
        # Raw reads of the pipe, stamped as they arrive: a buffered reader would hold lines the
        # selector no longer sees, and stamp them a tick late.
        out: list[tuple[int, str, float | None, float | None, float]] = []
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(out) < len(self.gpus):
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise Unavailable(f"nvidia-smi gave no line within {CALL_TIMEOUT_S:.0f} s")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise Unavailable(f"nvidia-smi exited with {self.proc.wait(CALL_TIMEOUT_S)}")
            now = time.time()
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                parts = [p.strip() for p in line.decode(errors="replace").split(",")]
                if len(parts) != 3:
                    continue
                try:
                    watts: float | None = float(parts[2])
                except ValueError:  # "[N/A]": not reported this tick
                    watts = None
                out.append((int(parts[0]), parts[1], watts, None, now))
        return out

    def close(self) -> None:
        self.sel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(CALL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class AmdSmi:
    backend: Backend = "amd-smi"
    source_metric = "amd-smi socket_power"
    paced = False

    def __init__(self) -> None:
        exe = shutil.which("amd-smi")
        if exe is None:
            raise Unavailable("amd-smi is not on PATH")
        self.exe = exe
        if not self.read():
            raise Unavailable("amd-smi reports no GPU power")

    def read(self) -> list[tuple[int, str, float | None, float | None, float]]:
        try:
            done = subprocess.run(
                [self.exe, "metric", "--power", "--json"], capture_output=True, text=True, timeout=CALL_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"amd-smi metric: {e}") from None
        if done.returncode != 0:
            raise Unavailable(f"amd-smi exited with {done.returncode}: {done.stderr.strip()[-300:]}")
        now = time.time()
        try:
            data = json.loads(done.stdout)
        except ValueError as e:
            raise Unavailable(f"amd-smi's output is not JSON: {e}") from None
        out: list[tuple[int, str, float | None, float | None, float]] = []
        for gpu in data if isinstance(data, list) else []:
            power = gpu.get("power") or {}
            # amd-smi names it socket_power (MI300 and later); earlier releases average_socket_power
            raw = next((power[k] for k in ("socket_power", "average_socket_power") if k in power), None)
            value = raw.get("value") if isinstance(raw, dict) else raw
            watts = float(value) if isinstance(value, (int, float)) else None
            out.append((int(gpu["gpu"]), str(gpu.get("uuid") or f"amd-gpu-{gpu['gpu']}"), watts, None, now))
        return out

    def close(self) -> None:
        pass


def open_source(interval_s: float) -> tuple[Source, str]:
    """The first source that reads here, and why the ones before it did not; Unavailable naming
    every source's reason when none does."""
    tried: list[str] = []
    for name, make in (
        ("nvml", Nvml),
        ("nvidia-smi", lambda: NvidiaSmi(interval_s)),
        ("amd-smi", AmdSmi),
    ):
        try:
            return make(), "; ".join(tried)
        except Unavailable as e:
            tried.append(f"{name}: {e}")
    raise Unavailable("; ".join(tried))


class Sampler:
    """Ticks a source until stopped, appending every GPU's reading to `out` (None: stdout only)."""

    def __init__(self, source: Source, interval_s: float, hostname: str, out: Path | None):
        self.source, self.interval_s, self.hostname, self.out = source, interval_s, hostname, out
        self.stop = threading.Event()
        self.ticks = 0
        self.read_s = 0.0  # time spent in the source's calls (the sampler's own cost per tick)

    def tick(self) -> list[Sample]:
        t0 = time.perf_counter()
        readings = self.source.read()
        if not self.source.paced:
            self.read_s += time.perf_counter() - t0
        samples = [Sample(ts, self.hostname, i, uuid, w, j) for i, uuid, w, j, ts in readings if w is not None]
        if self.out is not None:
            append(self.out, samples)
        self.ticks += 1
        return samples

    def run(self, duration_s: float | None = None, echo: bool = False, delay_s: float = 0.0) -> None:
        """Tick until stopped (or `duration_s`), the first tick after `delay_s`."""
        end = None if duration_s is None else time.monotonic() + duration_s
        next_at = time.monotonic() + delay_s
        if delay_s and not self.source.paced:
            self.stop.wait(delay_s)
        while not self.stop.is_set() and (end is None or time.monotonic() < end):
            for s in self.tick():
                if echo:
                    print(
                        f"{s.timestamp_unix:.3f} {s.hostname} gpu{s.gpu_index} {s.gpu_uuid} {s.power_w:.1f} W"
                        + ("" if s.energy_j is None else f" {s.energy_j:.1f} J"),
                        flush=True,
                    )
            if not self.source.paced:
                next_at += self.interval_s
                self.stop.wait(max(0.0, next_at - time.monotonic()))


def run_node(run_dir: Path, node: int, interval_s: float, phase: str = "") -> int:
    """The node's sampler: the record first (sampling, or missing and why), then ticks until
    SIGTERM/SIGINT. Exits 0 when there is nothing to sample: missing telemetry is not a failure."""
    run = RunDir(run_dir)
    record_path = run.power_record(node)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    hostname = socket.gethostname()
    started = time.time()
    try:
        os.nice(NICE)
    except OSError:
        pass
    try:
        source, skipped = open_source(interval_s)
    except Unavailable as e:
        rec = SamplerRecord(
            status="missing",
            reason=str(e),
            hostname=hostname,
            node=node,
            interval_s=interval_s,
            started_at_unix=started,
            phase=phase,
        )
        write_record(record_path, rec)
        log.warning("node %d: no GPU power telemetry: %s", node, e)
        return 0
    if source.backend == "amd-smi":
        interval_s = max(interval_s, AMD_MIN_INTERVAL_S)
    sampler = Sampler(source, interval_s, hostname, run.power_samples(node))

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        sampler.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        first = sampler.tick()
        rec = SamplerRecord(
            status="sampling",
            reason=f"skipped {skipped}" if skipped else "",
            backend=source.backend,
            source_metric=source.source_metric,
            hostname=hostname,
            node=node,
            interval_s=interval_s,
            started_at_unix=started,
            gpus=[f"{s.gpu_index}:{s.gpu_uuid}" for s in first],
            phase=phase,
        )
        write_record(record_path, rec)
        log.info("node %d: sampling %d GPU(s) through %s every %.2f s", node, len(first), source.backend, interval_s)
        sampler.run(delay_s=interval_s)  # the first tick was the one above
    except Unavailable as e:  # the source died mid-run: the gap it leaves is judged per point
        log.error("node %d: power sampling stopped: %s", node, e)
        return 1
    finally:
        source.close()
    return 0


def selftest(seconds: float, interval_s: float) -> int:
    """Sample for `seconds`, printing each reading; `missing: <reason>` where nothing reads."""
    try:
        source, skipped = open_source(interval_s)
    except Unavailable as e:
        print(f"missing: {e}")
        return 0
    sampler = Sampler(source, interval_s, socket.gethostname(), None)
    print(f"source: {source.backend} ({source.source_metric})" + (f"; skipped {skipped}" if skipped else ""))
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        sampler.run(seconds, echo=True)
    except Unavailable as e:
        print(f"missing: {e} (after {sampler.ticks} ticks)")
        return 1
    finally:
        source.close()
    wall = time.monotonic() - wall0
    per_tick = f", {1000 * sampler.read_s / sampler.ticks:.2f} ms in the source per tick" if not source.paced else ""
    print(
        f"{sampler.ticks} ticks in {wall:.1f} s; sampler CPU {100 * (time.process_time() - cpu0) / wall:.2f} % of one core{per_tick}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.power.sampler", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, help="sample into this run directory's power/raw/")
    ap.add_argument("--node", type=int, default=0)
    ap.add_argument("--phase", default="", help="the job's phase it samples with (its record says so)")
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between ticks")
    ap.add_argument("--selftest", type=float, metavar="S", help="sample S seconds to stdout and exit")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error(f"--interval must be positive, got {args.interval}")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s power %(levelname)s %(message)s")
    if args.selftest is not None:
        return selftest(args.selftest, args.interval)
    if args.run_dir is None:
        ap.error("--run-dir or --selftest is required")
    return run_node(args.run_dir, args.node, args.interval, args.phase)


if __name__ == "__main__":
    sys.exit(main())
