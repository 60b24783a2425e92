"""Overrides reach the loader as records (key, value, origin): a typed option's value is used as
given and named as its source; a `--set` text is parsed once and is never taken for an option."""

from __future__ import annotations

import pytest

from harness.config.load import ConfigError, load_recipe
from harness.config.overrides import Override, parse_set, records

RECIPE = "tiny-fp32-cpu-nixl-1p1d"


def test_a_set_text_is_parsed_once_into_its_record() -> None:
    assert parse_set("benchmark.concurrency=[1, 2]") == Override(("benchmark", "concurrency"), [1, 2], "--set")
    given = Override.of("slurm.time_limit", "00:10:00", "--time")
    assert records([given, "benchmark.isl=64"]) == [given, Override(("benchmark", "isl"), 64)]


def test_a_typed_value_is_used_as_given_and_its_option_is_its_source() -> None:
    # Precondition: as `--set` text the same characters are YAML, a list.
    with pytest.raises(ConfigError, match=r"^--set slurm.partition: "):
        load_recipe(RECIPE, ["slurm.partition=[gpu]"])
    rr = load_recipe(
        RECIPE,
        [
            Override.of("slurm.partition", "[gpu]", "--partition"),
            Override.of("topology.gpus_per_node", 0, "--gpus-per-node"),
        ],
    )
    assert rr.recipe.slurm.partition == "[gpu]" and rr.recipe.topology.gpus_per_node == 0
    sources = rr.sources()
    assert sources["slurm.partition"] == "--partition" and sources["topology.gpus_per_node"] == "--gpus-per-node"
    assert rr.set_values()["slurm.partition"] == "[gpu]"


def test_an_error_in_a_typed_value_names_its_option() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe(RECIPE, [Override.of("topology.gpus_per_node", -3, "--gpus-per-node")])
    assert str(e.value).startswith("--gpus-per-node: topology.gpus_per_node: Input should be greater than"), e.value


def test_a_set_text_that_looks_like_an_option_is_a_bad_key_not_that_option() -> None:
    # Once typed options were written '--OPTION KEY=VALUE' among the --set texts and told apart by
    # their form; a --set text of that form was taken for the option. Now its key is refused.
    with pytest.raises(ConfigError, match="unknown key"):
        load_recipe(RECIPE, ["--time slurm.partition=debug"])
