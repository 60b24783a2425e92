"""Recipes renamed to the recipe-name grammar (harness/config/recipe_names.py), old -> new.

Kept so that an old name in a script or a habit is told its new one (load_recipe) rather than
"not found". Not an alias: a recipe's runs live in results/<name>/, and two names for one recipe
would split them (its latest run, --resume, report) between two directories.
"""

from __future__ import annotations

RENAMED = {
    "dsr1-fp8-1p2d": "dsr1-fp8-mi355x-moriio-1p2d",
    "dsr1-fp8-1p2d-mooncake": "dsr1-fp8-h200-mooncake-1p2d",
    "dsr1-fp8-1p2d-nixl": "dsr1-fp8-mi355x-nixl-1p2d",
    "dsr1-fp8-b200-nixl-1p2d-wideep": "dsr1-fp8-b200-nixl-1p1d-wideep",
    "dsr1-fp8-h200-nixl-1p2d-wideep": "dsr1-fp8-h200-nixl-1p1d-wideep",
    "gptoss-120b-b200-nixl-1p1d": "gptoss-120b-fp4-b200-nixl-1p1d",
    "gptoss-120b-b200-nixl-1p2d": "gptoss-120b-fp4-b200-nixl-1p2d",
    "gpu-h200-8b-1p1d-nixl": "llama8b-shape-bf16-h200x1-nixl-1p1d",
    "gpu-h200-8b-1p1d-pdbench": "llama8b-shape-bf16-h200x1-pdbench-1p1d",
    "gpu-h200-8b-single": "llama8b-shape-bf16-h200x1-none-agg",
    "gpu-h200x2-8b-1p1d-nixl": "llama8b-shape-bf16-h200x2-nixl-1p1d",
    "gpu-h200x2-8b-1p1d-pdbench": "llama8b-shape-bf16-h200x2-pdbench-1p1d",
    "local-tiny-1p1d": "tiny-fp32-cpu-nixl-1p1d",
    "local-tiny-1p1d-mooncake": "tiny-fp32-cpu-mooncake-1p1d",
    "local-tiny-1p1d-pdbench": "tiny-fp32-cpu-pdbench-1p1d",
    "local-tiny-1p1d-profile": "tiny-fp32-cpu-nixl-1p1d-profile",
    "local-tiny-1p2d": "tiny-fp32-cpu-nixl-1p2d",
    "local-tiny-1p2d-affinity": "tiny-fp32-cpu-nixl-1p2d-affinity",
    "local-tiny-1p2d-vs-aggregated": "tiny-fp32-cpu-nixl-1p2d-vs-agg",
}
