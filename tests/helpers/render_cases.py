"""The rendered job of each golden case: shipped recipes, cluster profiles and container runtimes."""

from __future__ import annotations

from pathlib import Path

from harness.config import load_recipe
from harness.render import RenderContext, render_job

RECIPES = [
    "tiny-fp32-cpu-nixl-1p1d",
    "tiny-fp32-cpu-nixlpush-1p1d",
    "dsr1-fp8-mi355x-moriio-1p2d",
    "dsr1-fp8-mi355x-nixl-1p2d",
    "dsr1-fp8-h200-mooncake-1p2d",
]

CTX = RenderContext(
    run_dir="/shared/results/RUN", root="/opt/pdbench", python="/opt/pdbench/.venv/bin/python", git_commit="0123abcd"
)


def render_recipe(recipe: str, out: Path, overrides: list[str] | None = None, cluster: str | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    render_job(load_recipe(recipe, overrides or [], cluster=cluster), out, CTX)
    return out


# Golden cases: the shipped recipes, multi-node workers and every container runtime.
VARIANTS = {
    **{r: (r, []) for r in RECIPES},
    # Recipes on the example GPU sites' cluster profiles (weights and HF cache mounted
    # read-only, offline, GPU request style, node interface) and on the local cluster's.
    "dsr1-fp8-mi355x-moriio-1p2d@example-mi355x-mori": ("dsr1-fp8-mi355x-moriio-1p2d", [], "example-mi355x-mori"),
    "dsr1-fp8-h200-nixl-1p2d@example-h200-nixl": ("dsr1-fp8-h200-nixl-1p2d", [], "example-h200-nixl"),
    "dsr1-fp8-h200-nixl-1p2d--nsys-profile@example-h200-nixl": (
        "dsr1-fp8-h200-nixl-1p2d",
        ["benchmark.profile={roles: [prefill, decode], points: [8], tool: nsys}"],
        "example-h200-nixl",
    ),
    "tiny-fp32-cpu-nixl-1p2d@local": ("tiny-fp32-cpu-nixl-1p2d", [], "local"),
    # The DeepSeek-R1-shaped model (models.yaml dsr1-shape) on one H200 and on four, both connectors.
    **{
        r: (r, [])
        for r in (
            "dsr1-shape-fp8-h200x1-pdbench-1p1d",
            "dsr1-shape-fp8-h200x1-nixl-1p1d",
            "dsr1-shape-fp8-h200x1-none-agg",
            "dsr1-shape-fp8-h200x4-nixl-1p2d",
            "dsr1-shape-fp8-h200x4-pdbench-1p2d",
            "dsr1-shape-fp8-h200x4-nixl-1p1d-wideep",
            "dsr1-shape-fp8-h200x4-pdbench-1p1d-wideep",
        )
    },
    "tiny-fp32-cpu-nixl-1p2d-vs-agg@local": ("tiny-fp32-cpu-nixl-1p2d-vs-agg", [], "local"),
    # vllm-router as the job's router, with its own arguments per connector: NIXL by URL (and
    # the aggregated baseline in its regular mode), Mooncake with bootstrap ports, MoRI-IO by discovery.
    **{
        f"{recipe}--vllm-router": (recipe, ["proxy.kind=vllm-router"])
        for recipe in ("tiny-fp32-cpu-nixl-1p2d-vs-agg", "dsr1-fp8-h200-mooncake-1p2d", "dsr1-fp8-mi355x-moriio-1p2d")
    },
    # Router arms (proxy.arms): vllm-router's sweep, then pdbench's proxy and its client over the same servers.
    "tiny-fp32-cpu-nixl-1p1d--router-arms": (
        "tiny-fp32-cpu-nixl-1p1d",
        ["proxy.kind=vllm-router", "proxy.arms=[vllm-router, pdbench]"],
    ),
    "dsr1-fp8-mi355x-moriio-1p2d--decode-dp16-over-2-nodes": (
        "dsr1-fp8-mi355x-moriio-1p2d",
        [
            "topology.decode.workers=1",
            "topology.decode.tp=1",
            "topology.decode.dp=16",
            "topology.decode.ep=16",
            "topology.decode.dp_attention=true",
        ],
    ),
    "dsr1-fp8-mi355x-nixl-1p2d--prefill-tp16-over-2-nodes": (
        "dsr1-fp8-mi355x-nixl-1p2d",
        ["topology.prefill.nodes=2", "topology.prefill.tp=16"],
    ),
    "dsr1-fp8-mi355x-moriio-1p2d--docker-setup-steps": (
        "dsr1-fp8-mi355x-moriio-1p2d",
        [
            'container.setup=[{name: mori, run: "pip install amd-mori"}, {name: check, run: "python3 -c \'import mori\'"}]'
        ],
    ),
    **{
        f"dsr1-fp8-mi355x-moriio-1p2d--{rt}": ("dsr1-fp8-mi355x-moriio-1p2d", [f"container.runtime={rt}"])
        for rt in ("podman", "enroot", "apptainer", "none")
    },
    # Values that need quoting: mounts with a space and options, sbatch values with a space
    # and '#', a multi-line description.
    **{
        f"dsr1-fp8-mi355x-moriio-1p2d--{rt}-mounts-sbatch": (
            "dsr1-fp8-mi355x-moriio-1p2d",
            [
                f"container.runtime={rt}",
                'container.mounts={"/data/models": "/models:ro", "/scratch dir": "/scratch"}',
                'slurm.partition="gpu a"',
                'slurm.extra_sbatch=["--exclusive", "--comment=pd #1", "--mem=0"]',
                'description="DeepSeek-R1 1P2D\\nsecond line: $(not run)"',
            ],
        )
        for rt in ("docker", "enroot", "apptainer")
    },
    # Secrets pass by name (docker's -e NAME, apptainer's APPTAINERENV_NAME), never by value.
    **{
        f"dsr1-fp8-mi355x-moriio-1p2d--{rt}-secrets": (
            "dsr1-fp8-mi355x-moriio-1p2d",
            [f"container.runtime={rt}", 'secrets=["HF_TOKEN"]'],
        )
        for rt in ("docker", "apptainer")
    },
}


def variant(case: str) -> tuple[str, list[str], str | None]:
    """(recipe, overrides, cluster profile) of a golden case."""
    recipe, overrides, *cluster = VARIANTS[case]
    return recipe, overrides, cluster[0] if cluster else None


def render_case(case: str, out: Path) -> Path:
    recipe, overrides, cluster = variant(case)
    return render_recipe(recipe, out, overrides, cluster)
