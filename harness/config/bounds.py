"""What a recipe asks that its model cannot take: a prompt and answer longer than the servers'
--max-model-len. Checked by validate, submit (--dry-run too) and doctor before anything starts;
at run time every request would come back 400 from vLLM."""

from __future__ import annotations

import math

from harness.config.load import ConfigError, ResolvedRecipe


def check_lengths(rr: ResolvedRecipe) -> None:
    """Each shape's longest request (the largest prompt its range_ratio draws, the random
    prefix, the output) fits the model's max_model_len."""
    bench = rr.recipe.benchmark
    if bench.dataset != "random":  # other datasets' lengths come from their files
        return
    limit = rr.model.max_model_len
    for i, shape in enumerate(bench.shape_list()):
        r = shape.range_ratio if shape.range_ratio is not None else bench.range_ratio
        spread = 1 + r if bench.range_ratio_convention == "vllm" else 1  # inferencex: [r*isl, isl]
        longest = math.floor(shape.isl * spread) + bench.random_prefix_len + shape.osl
        if longest > limit:
            key = f"benchmark.shapes.{i}" if bench.shapes else "benchmark.isl"
            parts = f"isl {shape.isl}" + (f" x (1 + range_ratio {r})" if spread != 1 else "")
            parts += f" + random_prefix_len {bench.random_prefix_len}" if bench.random_prefix_len else ""
            raise ConfigError(
                rr.blame(key),
                key,
                f"a request may need {longest} tokens ({parts} + osl {shape.osl}), more than model "
                f"{rr.recipe.model}'s max_model_len {limit} ({rr.models_file}): vLLM would refuse it",
            )
