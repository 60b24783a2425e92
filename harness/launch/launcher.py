"""A launcher starts a rendered run directory's job (after submitit's Executor): Slurm or local."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from harness.config.load import ResolvedRecipe
from harness.launch.job import Job
from harness.rundir import RunDir
from harness.topology import JobPlan


class Launcher(ABC):
    name: ClassVar[str]
    # launch() returns once the job has ended: it ran in this process, in the foreground.
    foreground: ClassVar[bool] = False
    # Every node of the job runs on this one host: ports are planned job-wide (topology.plan).
    single_host: ClassVar[bool] = False

    def check(self, rr: ResolvedRecipe, plan: JobPlan) -> None:  # noqa: B027 (most launchers run any plan)
        """Raise ConfigError when this launcher cannot run the plan."""

    @abstractmethod
    def dry_run(self, run: RunDir, num_nodes: int) -> str:
        """What launch() would do, as one line for the user."""

    @abstractmethod
    def launch(self, run: RunDir, num_nodes: int) -> Job:
        """Start the job and record it in the run directory (RunDir.launch_record)."""
