"""The search file: loaded by name or path, every error naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.config.load import PROJECT_ROOT, ConfigError
from harness.search.spec import load_search

GOOD = {
    "recipe": "tiny-fp32-cpu-nixl-1p2d",
    "factors": {"prefill": [{"topology.prefill.workers": 1}, {"topology.prefill.workers": 2}]},
    "slos": {"tight": {"ttft_p90": 800, "tpot_p90": 40}},
    "concurrency": [1, 2, 4],
}


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def error(tmp_path: Path, **changes) -> ConfigError:
    data = {**GOOD, **changes}
    path = write(tmp_path, {k: v for k, v in data.items() if v is not None})
    with pytest.raises(ConfigError) as e:
        load_search(str(path))
    assert e.value.file.endswith("s.yaml"), e.value
    return e.value


def test_the_bundled_local_search_loads_by_name() -> None:
    s = load_search("local-tiny-pd")
    assert s.name == "local-tiny-pd"
    assert s.path == (PROJECT_ROOT / "searches" / "local-tiny-pd.yaml").resolve()
    assert s.spec.constraints.max_devices == 3
    assert s.spec.start_value in s.spec.concurrency
    assert s.cluster(None) == "local" and s.cluster("other") == "other"


def test_the_bundled_limits_search_differs_from_the_local_one_by_decodes_batch_limit() -> None:
    base, limits = load_search("local-tiny-pd").spec, load_search("local-tiny-pd-limits").spec
    assert limits.factors == base.factors | {
        "decode_seqs": [{"topology.decode.flags": {"max-num-seqs": 64}}, {"topology.decode.flags": {"max-num-seqs": 4}}]
    }
    assert limits.predict == "prune" and limits.slos == base.slos and limits.concurrency == base.concurrency


def test_a_good_file_loads_with_defaults_and_normalised_bounds(tmp_path: Path) -> None:
    s = load_search(str(write(tmp_path, {**GOOD, "slos": {"tight": {"TTFT_p90": 800}}})))
    assert s.spec.slos == {"tight": {"ttft_p90": 800.0}}
    assert s.spec.start_value == 1
    assert s.spec.repetitions.max == 2 and s.spec.prune.slack == 1.1
    assert s.spec.budget.max_jobs is None


def test_the_hash_follows_the_content(tmp_path: Path) -> None:
    a = load_search(str(write(tmp_path, GOOD, "a.yaml")))
    b = load_search(str(write(tmp_path, GOOD, "b.yaml")))
    c = load_search(str(write(tmp_path, {**GOOD, "concurrency": [1, 2, 8]}, "c.yaml")))
    assert a.hash == b.hash != c.hash


def test_a_missing_file_lists_the_searches() -> None:
    with pytest.raises(ConfigError, match=r"search file not found.*local-tiny-pd"):
        load_search("no-such-search")


def test_an_unknown_key_is_named(tmp_path: Path) -> None:
    e = error(tmp_path, budget={"max_job": 3})
    assert e.key == "budget.max_job" and "unknown key" in e.expected and "max_jobs" in e.expected


def test_a_missing_key_is_named(tmp_path: Path) -> None:
    e = error(tmp_path, recipe=None)
    assert e.key == "recipe" and "required" in e.expected


def test_the_ladder_is_ascending_and_unique(tmp_path: Path) -> None:
    e = error(tmp_path, concurrency=[1, 4, 2])
    assert e.key == "concurrency" and "ascending" in e.expected
    assert error(tmp_path, concurrency=[1, 2, 2]).key == "concurrency"


def test_start_is_a_ladder_value(tmp_path: Path) -> None:
    e = error(tmp_path, start=3)
    assert e.key == "start" and "[1, 2, 4]" in e.expected


def test_a_bad_slo_bound_names_the_slo_and_the_key(tmp_path: Path) -> None:
    e = error(tmp_path, slos={"tight": {"ttft_p90": -1}})
    assert e.key == "slos.tight.ttft_p90" and "positive" in e.expected
    e = error(tmp_path, slos={"tight": {"latency": 5}})
    assert e.key == "slos.tight.latency" and "<metric>_<stat>" in e.expected


def test_a_factor_alternative_needs_recipe_keys(tmp_path: Path) -> None:
    e = error(tmp_path, factors={"prefill": [{}]})
    assert e.key == "factors" and "prefill[0]" in e.expected
    e = error(tmp_path, factors={"prefill": [{"Topology Prefill": 1}]})
    assert e.key == "factors" and "dotted recipe key" in e.expected


def test_a_bad_override_names_its_index(tmp_path: Path) -> None:
    e = error(tmp_path, set=["benchmark.isl=256", "no-equals-sign"])
    assert e.key == "set[1]" and "KEY.PATH=VALUE" in e.expected
    e = error(tmp_path, baseline={"set": ["x"]})
    assert e.key == "baseline.set[0]"


def test_predict_off_unquoted_is_the_mode_off(tmp_path: Path) -> None:
    # YAML 1.1 reads `predict: off` as false; the file means the mode.
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(GOOD) + "predict: off\n")
    assert yaml.safe_load(path.read_text())["predict"] is False  # the precondition
    assert load_search(str(path)).spec.predict == "off"
    e = error(tmp_path, predict=True)
    assert e.key == "predict" and "true names no mode" in str(e)
