"""What a node runtime inside a container learns from the host: the heartbeat of
container.sh (Slurm killed the task: tear down) and the job state it records on a signal
(no scontrol in the image)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from harness.node.heartbeat import HostHeartbeat
from harness.node.signal_cause import describe_signal


def test_heartbeat(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat-node0"
    assert HostHeartbeat(None).lost() is None  # not in a container: nothing to watch
    clock = [100.0]
    watch = HostHeartbeat(beat, stale_after_s=20, confirm_s=10, monotonic=lambda: clock[0])
    assert "was removed" in (watch.lost() or "")
    beat.touch()
    assert watch.lost() is None
    old = time.time() - 45
    os.utime(beat, (old, old))
    # First seen stale: believed only once it stays unchanged for confirm_s of the watcher's clock.
    assert watch.lost() is None
    clock[0] += 9.9
    assert watch.lost() is None
    clock[0] += 0.2
    assert "stopped beating 45 s ago" in (watch.lost() or "")


def test_a_host_wide_stall_is_not_a_lost_host(tmp_path: Path) -> None:
    # The whole machine stalled past stale_after_s: the watcher wakes to a stale beat, and the
    # wrapper, woken too, touches it again within its beat; that is no reason to tear down.
    beat = tmp_path / "heartbeat-node0"
    clock = [0.0]
    watch = HostHeartbeat(beat, stale_after_s=20, confirm_s=10, monotonic=lambda: clock[0])
    old = time.time() - 30
    beat.touch()
    os.utime(beat, (old, old))
    assert watch.lost() is None
    clock[0] += 2
    beat.touch()  # the wrapper's next beat
    assert watch.lost() is None
    # It stalls again later: the confirmation starts afresh from the new stale beat.
    older = time.time() - 25
    os.utime(beat, (older, older))
    clock[0] += 8.5
    assert watch.lost() is None
    clock[0] += 9.9
    assert watch.lost() is None
    clock[0] += 0.2
    assert "stopped beating 25 s ago" in (watch.lost() or "")


@pytest.fixture
def in_container(tmp_path: Path, monkeypatch) -> Path:
    """A node runtime's environment inside a container: a Slurm job, no scontrol on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    record = tmp_path / "slurm-job-node1"
    monkeypatch.setenv("PDBENCH_SLURM_JOB_RECORD", str(record))
    return record


@pytest.mark.parametrize(
    "line, reason",
    [
        (
            "JobId=42 JobState=COMPLETING Reason=None TimeLimit=00:30:00",
            "received SIGTERM: the Slurm job was cancelled (scancel; JobState=COMPLETING Reason=None)",
        ),
        (
            "JobId=42 JobState=COMPLETING Reason=TimeLimit TimeLimit=00:01:00",
            "received SIGTERM: the Slurm job reached its time limit (00:01:00)",
        ),
    ],
)
def test_signal_cause_from_the_hosts_record(in_container: Path, line: str, reason: str) -> None:
    in_container.write_text(line + "\n")
    assert describe_signal(signal.SIGTERM) == reason


def test_signal_cause_waits_a_bounded_time_for_the_record(in_container: Path) -> None:
    t0 = time.monotonic()
    reason = describe_signal(signal.SIGTERM, timeout_s=0.5)
    assert time.monotonic() - t0 < 3
    assert reason.startswith("received SIGTERM from outside the job (Slurm's job state unreadable: the host recorded")
