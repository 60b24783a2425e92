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
    watch = HostHeartbeat(beat, stale_after_s=20)
    assert "was removed" in (watch.lost() or "")
    beat.touch()
    assert watch.lost() is None
    old = time.time() - 45
    os.utime(beat, (old, old))
    assert "stopped beating 45 s ago" in (watch.lost() or "")


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
