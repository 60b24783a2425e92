"""Cluster profiles: a site's settings (clusters/<name>.yaml) kept out of portable recipes.

A profile holds what belongs to the cluster: Slurm partition/account/GPU request style,
GPUs per node, container runtime and images, mounts, where models and the HF cache live,
the node network interface, NIC overrides and extra environment. It is a partial recipe
(the same keys, checked by the same schema once merged) plus `images`, which picks the
image by model name. Precedence, lowest first: recipe < profile < --set.

Search order for a profile NAME (from --cluster, else $PDBENCH_CLUSTER; neither: none):
  1. NAME is a path to a file (contains '/' or ends in .yaml/.yml)
  2. $PDBENCH_CLUSTERS_DIR/NAME.yaml
  3. ~/.config/pdbench/clusters/NAME.yaml
  4. <pdbench checkout>/clusters/NAME.yaml
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from harness.config.schema import Comment, Env, Image, Text
from harness.config.spelling import did_you_mean
from harness.strict import Strict

ENV_VAR = "PDBENCH_CLUSTER"
DIR_ENV_VAR = "PDBENCH_CLUSTERS_DIR"


class ProfileRole(Strict):
    cpu_bind: list[Text] | None = Field(None, description="CPU-only nodes: VLLM_CPU_OMP_THREADS_BIND per worker")
    env: Env | None = Field(None, description="environment of this role's servers on this cluster")


class ProfileTopology(Strict):
    """The part of a recipe's topology that is the hardware's, not the benchmark's."""

    gpus_per_node: int | None = Field(None, ge=0, description="GPUs per node (0: CPU-only)")
    nic_detection: bool | None = Field(None, description="servers source `pdbench nic` (RDMA env)")
    prefill: ProfileRole | None = None
    decode: ProfileRole | None = None


class ClusterProfile(Strict):
    description: Comment = Field("", description="what this cluster is")
    images: dict[Text, Image] = Field(
        {},
        description="model name pattern (fnmatch, e.g. 'deepseek-*') -> container image; the first match wins",
    )
    # Recipe sections, checked by the recipe's schema after the merge (errors name this file).
    site: dict[str, Any] = Field({}, description="the recipe's site section")
    slurm: dict[str, Any] = Field({}, description="the recipe's slurm section")
    container: dict[str, Any] = Field({}, description="the recipe's container section")
    topology: ProfileTopology = Field(ProfileTopology(), description="hardware part of the recipe's topology")
    env: dict[str, Any] = Field({}, description="environment of every process (NIC overrides such as IBDEVICES)")
    timeouts: dict[str, Any] = Field({}, description="the recipe's timeouts section")

    def overlay(self, model: str) -> dict[str, Any]:
        """The profile as a partial recipe for `model`."""
        out: dict[str, Any] = {
            k: v
            for k, v in (("site", self.site), ("slurm", self.slurm), ("env", self.env), ("timeouts", self.timeouts))
        }
        container = dict(self.container)
        image = next((img for pattern, img in self.images.items() if fnmatch.fnmatchcase(model, pattern)), None)
        if image is not None:
            container["image"] = image
        out["container"] = container
        out["topology"] = self.topology.model_dump(exclude_none=True)
        return {k: v for k, v in out.items() if v}


def profile_path(name: str, root: Path) -> Path:
    """The profile file for NAME by the search order above; raises FileNotFoundError listing where it looked."""
    if "/" in name or name.endswith((".yaml", ".yml")):
        return Path(name)
    candidates = []
    if os.environ.get(DIR_ENV_VAR):
        candidates.append(Path(os.environ[DIR_ENV_VAR]) / f"{name}.yaml")
    candidates.append(Path.home() / ".config" / "pdbench" / "clusters" / f"{name}.yaml")
    candidates.append(root / "clusters" / f"{name}.yaml")
    for c in candidates:
        if c.is_file():
            return c
    known = sorted(p.stem for p in (root / "clusters").glob("*.yaml"))
    raise FileNotFoundError(
        f"cluster profile {name!r} not found{did_you_mean(name, known)} (looked in {', '.join(str(c.parent) for c in candidates)}; "
        f"shipped: {', '.join(known) or 'none'})"
    )


def chosen_profile(explicit: str | None) -> str | None:
    """--cluster wins over $PDBENCH_CLUSTER; an empty value means no profile."""
    name = explicit if explicit is not None else os.environ.get(ENV_VAR)
    return name or None
