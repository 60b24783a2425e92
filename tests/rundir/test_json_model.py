"""harness.rundir.json_model: a run-directory JSON file read into its model, the error naming the
file and the field, through each format that reads that way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.rundir import perf_profile, prior_prediction


@pytest.mark.parametrize(
    "module, error",
    [(perf_profile, perf_profile.ProfileError), (prior_prediction, prior_prediction.PredictionError)],
    ids=["perf_profile", "prior_prediction"],
)
def test_each_reader_names_the_file_and_what_is_wrong(tmp_path: Path, module, error) -> None:
    path = tmp_path / "f.json"
    with pytest.raises(error, match=rf"^{path}: unreadable: No such file or directory$"):
        module.read(path)
    path.write_text('{"format": 1,')
    with pytest.raises(error, match=rf"^{path}: not valid JSON \(Expecting property name .* at line 1\)$"):
        module.read(path)
    path.write_text("[]")
    with pytest.raises(error, match=rf"^{path}: \(top level\): "):
        module.read(path)


def test_a_bad_field_is_named_by_its_dotted_location(tmp_path: Path) -> None:
    path = tmp_path / "prediction.json"
    point = {"concurrency": 0, "isl": 16, "osl": 8, "ttft_p90_ms": 1.0, "tpot_mean_ms": 1.0}
    point |= {"goodput_per_device": 1.0, "band": 0.1}
    path.write_text(json.dumps({"made_at": 0, "source": "r", "by": "b", "points": [point]}))
    with pytest.raises(prior_prediction.PredictionError) as e:
        prior_prediction.read(path)
    assert str(e.value).startswith(f"{path}: points.0.concurrency: Input should be greater than or equal to 1"), e.value
    # The same file with the field fixed reads: the error was that field's alone.
    path.write_text(path.read_text().replace('"concurrency": 0', '"concurrency": 1'))
    assert prior_prediction.read(path).points[0].concurrency == 1
