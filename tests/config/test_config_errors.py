"""The loader's errors name the whole key, digits and dots included (`ttft_p90`, `ttft_p99.9`),
whether the value came from the recipe file or from `--set`, and where a run's client config is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.config import ConfigError, load_recipe
from harness.config.load import PROJECT_ROOT

SEARCH = "benchmark.slo_search"


def _recipe(tmp_path: Path, slos: dict, **benchmark) -> Path:
    """tiny-fp32-cpu-nixl-1p1d with an SLO search over these SLOs, as a file of its own."""
    data = yaml.safe_load((PROJECT_ROOT / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml").read_text())
    data["benchmark"] |= {"slo_search": {"slos": slos}, **benchmark}
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("slos", "benchmark", "key", "words"),
    [
        ({"tight": {"ttft_p90": -5}}, {}, "slos.tight.ttft_p90", "the bound must be a positive number"),
        ({"tight": {"ttft_p99.9": -5}}, {}, "slos.tight.ttft_p99.9", "the bound must be a positive number"),
        ({"tight2": {"ttft_p9x": 800}}, {}, "slos.tight2.ttft_p9x", "expected <metric>_<stat>"),
        ({"tight": {"ttft_p95": 800}}, {}, "slos.tight.ttft_p95", "add 95 to benchmark.percentiles"),
        ({"tight": {"ttft_p99.9": 800}}, {"percentiles": [90]}, "slos.tight.ttft_p99.9", "add 99.9 to"),
        ({"b:d": {"ttft_p90": 800}}, {}, "slos.b:d", "an SLO's name is a word"),
    ],
)
def test_an_error_in_a_recipe_file_names_the_whole_key(
    tmp_path: Path, slos: dict, benchmark: dict, key: str, words: str
) -> None:
    path = _recipe(tmp_path, slos, **benchmark)
    with pytest.raises(ConfigError) as e:
        load_recipe(str(path))
    assert e.value.key == f"{SEARCH}.{key}", str(e.value)
    assert e.value.file == str(path)
    # The key is said once, before the words, not again inside them.
    assert str(e.value).startswith(f"{path}: {SEARCH}.{key}: ") and words in e.value.expected, str(e.value)
    assert not e.value.expected.startswith("slos"), str(e.value)


def test_an_error_from_set_names_the_whole_key_it_set() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p1d", [f"{SEARCH}.slos.tight.ttft_p90=-5"])
    assert e.value.key == f"{SEARCH}.slos.tight.ttft_p90"
    # The --set names the key: the message does not say it twice.
    assert (
        str(e.value)
        == f"--set {SEARCH}.slos.tight.ttft_p90: the bound must be a positive number of milliseconds, got -5.0"
    )


def test_a_check_across_the_section_names_the_key_it_is_about() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p1d", [f"{SEARCH}.slos.tight.ttft_p90=800", "benchmark.concurrency=[4,1]"])
    assert e.value.key == "benchmark.concurrency"
    assert e.value.expected.startswith("with slo_search it is the ladder and must be ascending")


def test_a_runs_unreadable_client_config_names_the_whole_key(tmp_path: Path) -> None:
    """`pdbench status` and submit's plan read a run's bench.json: its error names the key too."""
    from harness.rundir import RunDir
    from harness.submit.points import PointsUnknown, planned

    bench = {"base_url": "http://x:1", "model": "m", "tokenizer": "t", "result_dir": ".", "isl": 8, "osl": 8}
    bench |= {"concurrency": [1], "slo_search": {"slos": {"tight": {"ttft_p90": -5.0}}}}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    with pytest.raises(PointsUnknown) as e:
        planned(RunDir(tmp_path))
    assert str(e.value) == (
        f"{tmp_path / 'bench.json'}: not a readable client config (slo_search.slos.tight.ttft_p90: "
        "the bound must be a positive number of milliseconds, got -5.0)"
    )


def test_a_set_key_with_a_decimal_point_is_named_whole_with_the_way_to_set_it() -> None:
    """`--set` splits its key at every '.': `...ttft_p99.9=800` gives ttft_p99 a mapping {9: 800}.
    The error names the key meant and a --set that sets it, which then loads."""
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p1d", [f"{SEARCH}.slos.tight.ttft_p99.9=800"])
    assert e.value.key == f"{SEARCH}.slos.tight.ttft_p99.9"
    fix = f"--set '{SEARCH}.slos.tight={{ttft_p99.9: 800}}'"
    assert e.value.expected.endswith(fix), str(e.value)
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", [fix.removeprefix("--set ").strip("'")])
    assert rr.recipe.benchmark.slo_search is not None
    assert rr.recipe.benchmark.slo_search.slos == {"tight": {"ttft_p99.9": 800.0}}
