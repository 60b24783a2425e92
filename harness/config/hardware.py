"""The hardware a recipe is written for, and a cluster profile that would change it.

A recipe carries its hardware in its image (ROCm or CUDA), `container.gpus`, its GPU count
per node (0: CPU-only), its Slurm GPU request or partition, and the GPU named in its name
or description. A cluster profile that puts an NVIDIA recipe on AMD nodes (or on CPU-only
ones) renders a job whose flags, image and header disagree; it is refused when planned.
"""

from __future__ import annotations

import re
from typing import Any

from harness.config.load import ConfigError, ResolvedRecipe

VENDORS = {"nvidia": "NVIDIA GPUs", "amd": "AMD GPUs", "cpu": "CPU-only nodes"}
_GPU_NAMES = {
    "nvidia": r"a100|a10g?|h100|h200|h20|h800|b200|b300|gb200|gb300|l40s?|l4",
    "amd": r"mi250x?|mi300[xa]?|mi308x|mi325x|mi350x|mi355x",
    "cpu": r"cpu",
}
_NAMED = {vendor: re.compile(rf"(?<![a-z0-9])({names})(?![a-z0-9])") for vendor, names in _GPU_NAMES.items()}
# Keys whose text names the hardware (a Slurm partition "mi355x", GRES "gpu:h200").
_NAMING_KEYS = ("slurm.partition", "slurm.gres_name", "slurm.constraint")


def vendor_of(gpu: str) -> str | None:
    """The vendor of a GPU name (h200: nvidia, mi355x: amd, cpu: cpu), or None for a name unknown here."""
    return next((vendor for vendor, names in _GPU_NAMES.items() if re.fullmatch(names, gpu)), None)


def evidence(values: dict[str, Any], texts: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(key, what it says, vendor) for each value that tells the hardware."""
    out = []
    gpus = values.get("container.gpus")
    if gpus in ("nvidia", "amd"):
        out.append(("container.gpus", str(gpus), str(gpus)))
    image = values.get("container.image")
    if isinstance(image, str):
        if "rocm" in image.lower():
            out.append(("container.image", image, "amd"))
        elif re.search(r"cuda|nvcr\.io", image.lower()):
            out.append(("container.image", image, "nvidia"))
    if values.get("topology.gpus_per_node") == 0:
        out.append(("topology.gpus_per_node", "0", "cpu"))
    for key in (*_NAMING_KEYS, *texts):
        text = values.get(key)
        if not isinstance(text, str):
            continue
        for vendor, pattern in _NAMED.items():
            if vendor == "cpu" and key in _NAMING_KEYS:
                continue  # a partition named "cpu" says nothing of the job's GPUs
            m = pattern.search(text.lower())
            if m:
                out.append((key, text[m.start(1) : m.end(1)] if key in texts else text, vendor))
    return out


def _said(items: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{key} {what}" for key, what, _ in items)


def check_hardware(rr: ResolvedRecipe) -> None:
    """ConfigError naming the cluster profile, or the `--set` key, that moves the recipe to other hardware."""
    own = evidence(rr.file_values(), texts=("name", "description"))
    if not own and rr.recipe.name is None:
        own = evidence({"name": rr.name}, texts=("name",))
    own_vendors = {v for _, _, v in own}
    if len(own_vendors) != 1:
        return  # the recipe says nothing of its hardware (or contradicts itself): nothing to compare
    (vendor,) = own_vendors
    written = (
        f"the recipe is written for {VENDORS[vendor]} ({_said(own)}): its image, flags and GPU request would not match"
    )
    profile = [e for e in evidence(rr.profile_values()) if e[2] != vendor]
    if profile and rr.cluster_file is not None:
        other = profile[0][2]
        raise ConfigError(
            rr.cluster_file,
            profile[0][0],
            f"this cluster profile moves recipe {rr.name} to {VENDORS[other]} ({_said(profile)}), but {written} "
            f"the nodes. Use a recipe written for {VENDORS[other]}, or a profile of a cluster with {VENDORS[vendor]}",
        )
    given = [e for e in evidence(rr.set_values()) if e[2] != vendor]
    if given:
        key, other = given[0][0], given[0][2]
        raise ConfigError(
            f"--set {key}",
            key,
            f"moves recipe {rr.name} to {VENDORS[other]} ({_said(given)}), but {written} each other. "
            f"Use a recipe written for {VENDORS[other]}",
        )
