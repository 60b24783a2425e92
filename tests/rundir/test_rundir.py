"""RunDir and ResultName: the one owner of a run directory's names."""

from __future__ import annotations

import math
import os
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

from harness.rundir import (
    Failure,
    FailureRecords,
    LockUnreadable,
    ResultName,
    RunDir,
    RunNotFound,
    read_status,
    write_status,
)
from harness.rundir.paths import CONTROL_FILES
from harness.rundir.status import TIME_LIMIT_WARNING


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (ResultName(4, math.inf, prefill_gpus=1, decode_gpus=2), "concurrency_4_req_rate_inf_gpus_3_ctx_1_gen_2.json"),
        (ResultName(4, math.inf, gpus=8), "concurrency_4_req_rate_inf_gpus_8.json"),  # one aggregated server
        (ResultName(4, math.inf), "concurrency_4_req_rate_inf.json"),  # split unknown
        (ResultName(8, 2.5, prefill_gpus=2, decode_gpus=2), "concurrency_8_req_rate_2.5_gpus_4_ctx_2_gen_2.json"),
        (ResultName(8, 4.0, prefill_gpus=0, decode_gpus=1), "concurrency_8_req_rate_4_gpus_1_ctx_0_gen_1.json"),
        (
            ResultName(16, math.inf, "isl_1024_osl_128", prefill_gpus=8, decode_gpus=16),
            "concurrency_16_req_rate_inf_isl_1024_osl_128_gpus_24_ctx_8_gen_16.json",
        ),
    ],
)
def test_result_names_are_built_and_parsed_back(name: ResultName, expected: str) -> None:
    assert name.filename == expected
    assert ResultName.parse(expected) == name
    assert ResultName.parse(expected.removesuffix(".json")) == name
    assert Path(expected).match(ResultName.GLOB)


def test_a_shape_gives_its_lengths() -> None:
    assert ResultName.parse("concurrency_4_req_rate_inf_isl_1024_osl_128_gpus_3_ctx_1_gen_2").isl_osl == (1024, 128)  # type: ignore[union-attr]
    assert ResultName(4, math.inf).isl_osl is None


def test_point_tag_names_the_metrics_folder() -> None:
    assert ResultName(16, math.inf, "isl_1024_osl_128", 8, 16).point_tag == "concurrency_16_isl_1024_osl_128"
    assert ResultName(2, math.inf).point_tag == "concurrency_2"


@pytest.mark.parametrize(
    "other",
    ["results_concurrency_4_gpus_8.json", "concurrency_4.json", "concurrency_x_req_rate_inf.json", "plan.json"],
)
def test_other_names_are_not_pdbench_results(other: str) -> None:
    assert ResultName.parse(other) is None


def test_create_never_reuses_and_resolve_finds_latest(tmp_path: Path) -> None:
    a = RunDir.create(tmp_path, "r")
    b = RunDir.create(tmp_path, "r")
    assert a.path != b.path and a.logs.is_dir() and b.logs.is_dir()
    for run in (a, b):
        run.plan.write_text("{}")
    latest = max(a.path, b.path)
    assert RunDir.resolve("r", tmp_path).path == latest.resolve()
    assert RunDir.resolve(str(a.path), tmp_path).path == a.path.resolve()
    with pytest.raises(RunNotFound, match="nope"):
        RunDir.resolve("nope", tmp_path)


def test_results_are_the_result_files_only(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    names = [ResultName(c, math.inf, prefill_gpus=1, decode_gpus=1).filename for c in (1, 2)]
    for n in [*names, *CONTROL_FILES]:
        (tmp_path / n).write_text("{}")
    assert run.result_names() == sorted(names)


def test_status_falls_back_to_the_failure_records(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert read_status(run) is None
    FailureRecords(run).record(Failure(1, TIME_LIMIT_WARNING))
    FailureRecords(run).record(Failure(0, "later, dropped"))
    fallback = read_status(run)
    assert fallback is not None and fallback["state"] == "timeout" and fallback["failure"]["node"] == 1
    write_status(run, 1, Failure(0, "a server died"))
    assert read_status(run)["state"] == "failed"  # type: ignore[index]
    write_status(run, 0, None)
    assert read_status(run)["state"] == "succeeded"  # type: ignore[index]


def test_results_readme_is_generated_from_the_layout() -> None:
    from harness.rundir import file_table as layout

    readme = Path(__file__).resolve().parents[2] / "results" / "README.md"
    assert readme.read_text() == layout.markdown(), "run: python -m harness.rundir.file_table > results/README.md"


def test_every_name_of_a_run_directory_is_in_the_layout() -> None:
    from harness.rundir import file_table as layout
    from harness.rundir import paths

    words = [w.strip(",") for e in layout.LAYOUT for w in e.name.replace("/", " ").split()]
    documented = [re.sub(r"<[^>]*>|\[[^]]*\]", "*", w) for w in words]  # <N>, [-<phase>]: any
    names = [v for k, v in vars(paths).items() if k.isupper() and isinstance(v, str)]
    assert len(names) > 15  # the module's name constants were found
    undocumented = [n for n in names if not any(fnmatch(part, d) for part in n.split("/") for d in documented)]
    assert undocumented == []


def test_runs_made_in_one_second_are_listed_newest_first(tmp_path: Path) -> None:
    # Two runs in the same second whose random ids sort against their order: the later one's lock
    # (written once, by render) is what says it is newer.
    ids = ["20261126T030000Z-ffffff", "20261126T030000Z-000000"]  # made in this order
    for k, run_id in enumerate(ids):
        run = RunDir(tmp_path / "tiny" / run_id)
        run.path.mkdir(parents=True)
        run.plan.write_text("{}")
        run.lock.write_text("recipe: {}\n")
        os.utime(run.lock, ns=(10**18 + k, 10**18 + k))
    assert sorted(ids, reverse=True) == ids  # the precondition: the ids alone would list the older first
    assert [r.run_id for r in RunDir.all_runs(tmp_path)] == list(reversed(ids))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "No such file"),  # never rendered
        ("recipe: [unclosed\n", "while parsing"),
        ("- a list\n", "not a mapping"),
    ],
)
def test_an_unreadable_lock_is_refused_naming_the_file(tmp_path: Path, text: str | None, why: str) -> None:
    run = RunDir.create(tmp_path, "r")
    if text is not None:
        run.lock.write_text(text)
    assert run.lock.is_file() is (text is not None)
    with pytest.raises(LockUnreadable, match=why) as e:
        run.read_lock()
    assert str(e.value).startswith(f"{run.lock}: unreadable as a recipe lock")


def test_a_lock_reads_back_as_written(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    run.lock.write_text("recipe: {topology: {gpus_per_node: 0}}\nmodel: {name: tiny}\n")
    assert run.read_lock() == {"recipe": {"topology": {"gpus_per_node": 0}}, "model": {"name": "tiny"}}
