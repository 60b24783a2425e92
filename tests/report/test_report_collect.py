"""pdbench collect: InferenceX-style aggregate entries, checked against hand-computed values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.inferencex_contract import BASE_KEYS, MULTINODE_KEYS
from typer.testing import CliRunner

from harness.cli import app
from harness.report.collect import collect, write_new
from harness.report.collect_entry import CollectEntry

FIXTURES = Path(__file__).parents[1] / "fixtures" / "results"
DSR1_A = FIXTURES / "dsr1-fp8-2p4d" / "20261201T100000Z-aaa111"
DSR1_B = FIXTURES / "dsr1-fp8-2p4d" / "20261202T100000Z-bbb222"
TINY_1P2D = FIXTURES / "tiny-fp32-cpu-nixl-1p2d" / "20261122T034324Z-a3eb41"

# InferenceX's utils/process_result.py, multinode branch, in its order (helpers.inferencex_contract
# owns its keys); prefill_hw and decode_hw come only from the workflow's PREFILL_HARDWARE and
# DECODE_HARDWARE, which no pdbench aggregate sets.
IX_KEYS = [*BASE_KEYS, *(k for k in MULTINODE_KEYS if k not in ("prefill_hw", "decode_hw"))]


def _by_conc(entries: list[dict]) -> dict[int, dict]:
    return {e["conc"]: e for e in entries}


def test_hand_computed_values() -> None:
    result = collect([DSR1_A], hw="h200-disagg")
    e = _by_conc(result.entries)
    assert sorted(e) == [64, 128]  # 256 is invalid
    c64 = e[64]
    # 2 prefill workers x TP8 = 16 GPUs, 4 decode workers x TP8 = 32; total 48000 tok/s, output 6000.
    assert c64["tput_per_gpu"] == 48000 / 48 == 1000.0
    assert c64["output_tput_per_gpu"] == 6000 / 32 == 187.5
    assert c64["input_tput_per_gpu"] == (48000 - 6000) / 16 == 2625.0
    # ms -> seconds, without the suffix.
    assert c64["median_ttft"] == 0.4 and c64["p99_ttft"] == 0.9 and c64["p99.9_ttft"] == 1.2
    assert c64["mean_ttft"] == 0.5 and c64["median_e2el"] == 26.0 and c64["p99.9_itl"] == 0.16
    assert c64["median_tpot"] == 0.025 and c64["p99_tpot"] == 0.04
    # *_intvty = 1000 / tpot in ms (tokens/s/user), including InferenceX's meaningless std_intvty.
    assert c64["median_intvty"] == 1000 / 25 == 40.0
    assert c64["p99_intvty"] == 1000 / 40 == 25.0
    assert c64["p99.9_intvty"] == 1000 / 50 == 20.0
    assert c64["mean_intvty"] == 1000 / 31.25 == 32.0
    assert c64["std_intvty"] == 1000 / 6.25 == 160.0
    assert "median_ttft_ms" not in c64 and not any(k.endswith("_ms") for k in c64)
    assert {k: c64[k] for k in IX_KEYS[:12]} == {
        "hw": "h200-disagg",
        "conc": 64,
        "image": "vllm/vllm-openai:v0.32.0",
        "model": "deepseek-ai/DeepSeek-R1-0528",
        "infmax_model_prefix": "dsr1",
        "framework": "vllm-disagg",
        "precision": "fp8",
        "spec_decoding": "none",
        "disagg": True,
        "recipe_fingerprint": "a1b2c3d4e5f60718",
        "isl": 8192,
        "osl": 1024,
    }
    assert {k: c64[k] for k in IX_KEYS[12:31]} == {
        "router": {"name": "pdbench", "version": "0.1.0"},
        "kv_p2p_transfer": "nixl",
        "is_multinode": True,
        "prefill_tp": 8,
        "prefill_pp": 1,
        "prefill_dcp_size": 1,
        "prefill_pcp_size": 1,
        "prefill_ep": 1,
        "prefill_dp_attention": "false",
        "prefill_num_workers": 2,
        "decode_tp": 8,
        "decode_pp": 1,
        "decode_dcp_size": 1,
        "decode_pcp_size": 1,
        "decode_ep": 8,
        "decode_dp_attention": "true",
        "decode_num_workers": 4,
        "num_prefill_gpu": 16,
        "num_decode_gpu": 32,
    }


def test_key_set_and_order() -> None:
    entry = _by_conc(collect([DSR1_A], hw="x").entries)[64]
    latency = []
    # The result file's *_ms keys in file order, each followed by its intvty twin for tpot.
    src = json.loads((DSR1_A / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").read_text())
    for key in src:
        if key.endswith("ms"):
            latency.append(key.replace("_ms", ""))
            if "tpot" in key:
                latency.append(key.replace("_ms", "").replace("tpot", "intvty"))
    assert list(entry) == IX_KEYS + latency
    assert len(latency) == 4 * 6 + 6


def test_real_pdbench_run() -> None:
    src = {
        json.loads(p.read_text())["max_concurrency"]: json.loads(p.read_text())
        for p in TINY_1P2D.glob("concurrency_*.json")
    }
    # A real run from before validity verdicts: no evidence, so only on request.
    assert collect([TINY_1P2D], hw="cpu").entries == []
    entries = _by_conc(collect([TINY_1P2D], hw="cpu", include_unverified=True).entries)
    assert sorted(entries) == [1, 4]
    for conc, e in entries.items():
        r = src[conc]
        assert e["num_prefill_gpu"] == 1 and e["num_decode_gpu"] == 2
        assert e["tput_per_gpu"] == pytest.approx(r["total_token_throughput"] / 3)
        assert e["output_tput_per_gpu"] == pytest.approx(r["output_throughput"] / 2)
        assert e["input_tput_per_gpu"] == pytest.approx(r["total_token_throughput"] - r["output_throughput"])
        assert e["p99.9_e2el"] == pytest.approx(r["p99.9_e2el_ms"] / 1000)
        assert e["median_intvty"] == pytest.approx(1000 / r["median_tpot_ms"])
        assert e["image"] == "" and e["isl"] == 256 and e["osl"] == 32
        assert e["model"] == "tiny" and e["infmax_model_prefix"] == "tiny-llama" and e["precision"] == "fp32"


def test_no_decode_gpu_divides_output_by_all(tmp_path: Path) -> None:
    run = tmp_path / "agg"
    run.mkdir()
    d = json.loads((DSR1_A / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").read_text())
    d["metadata"].update(prefill_gpus=8, decode_gpus=0)
    (run / "concurrency_64_req_rate_inf_gpus_8.json").write_text(json.dumps(d))
    e = collect([run], hw="x").entries[0]
    assert e["output_tput_per_gpu"] == 6000 / 8 and e["tput_per_gpu"] == 48000 / 8
    assert e["input_tput_per_gpu"] == 42000 / 8
    assert (e["decode_tp"], e["decode_ep"], e["decode_pp"], e["num_decode_gpu"]) == (0, 0, 1, 0)


def test_invalid_points_left_out_unless_asked() -> None:
    result = collect([DSR1_A], hw="x")
    assert [(s.path.name, s.reason.split(" (")[0]) for s in result.skipped] == [
        ("concurrency_256_req_rate_inf_gpus_48_ctx_16_gen_32.json", "invalid point")
    ]
    assert "kv_transferred" in result.skipped[0].reason
    kept = _by_conc(collect([DSR1_A], hw="x", include_invalid=True).entries)
    assert sorted(kept) == [64, 128, 256]
    assert kept[256]["valid"] is False and kept[256]["validity"] == "invalid" and "valid" not in kept[64]


def test_unverified_points_left_out_unless_asked(tmp_path: Path) -> None:
    # The writer's representation: metadata.valid null and validity.verdict "unverified".
    run = tmp_path / "run"
    run.mkdir()
    d = json.loads((DSR1_A / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").read_text())
    d["metadata"].update(
        valid=None,
        validity={"verdict": "unverified", "valid": None, "reasons": ["kv_transferred: not checked: no metric"]},
    )
    (run / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").write_text(json.dumps(d))
    result = collect([run], hw="x")
    assert result.entries == [] and result.skipped[0].reason.startswith(
        "unverified point (no evidence it measured what it claims: kv_transferred: not checked: no metric)"
    )
    (e,) = collect([run], hw="x", include_unverified=True).entries
    assert e["validity"] == "unverified" and "valid" not in e
    # A recorded verdict wins over an older `valid` flag.
    d["metadata"].update(valid=True)
    (run / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").write_text(json.dumps(d))
    assert collect([run], hw="x").entries == []


def test_dedupe_by_run_fingerprint_isl_osl_conc(tmp_path: Path) -> None:
    # The same run twice: read once.
    assert len(collect([DSR1_A, DSR1_A], hw="x").entries) == 2
    # A runner's prefixed copy of a result in the same run: one entry, the copy listed.
    run = tmp_path / "run"
    shutil.copytree(DSR1_B, run)
    shutil.copy(
        run / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json",
        run / "RESULT_concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json",
    )
    result = collect([run], hw="x", include_unverified=True)
    assert sorted(e["conc"] for e in result.entries) == [64, 128, 256, 512]
    assert [s.path.name for s in result.skipped] == ["RESULT_concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json"]
    assert result.skipped[0].reason.startswith("duplicate of concurrency_64_")
    # Another run with the same recipe, ISL, OSL and concurrencies is another measurement: kept.
    other = tmp_path / "again"
    shutil.copytree(DSR1_B, other)
    assert len(collect([DSR1_B, other], hw="x", include_unverified=True).entries) == 8


def test_files_it_cannot_collect_are_listed() -> None:
    result = collect([FIXTURES / "vllm-serve", FIXTURES / "srt-slurm-4049", FIXTURES / "broken"])
    reasons = {s.path.name: s.reason for s in result.skipped}
    assert reasons["vllm-infqps-concurrency8-Llama-3.1-8B-Instruct-20261120-101500.json"].startswith(
        "no pdbench metadata block"
    )
    assert reasons["results_concurrency_16_gpus_24_ctx_8_gen_16.json"].startswith("no pdbench metadata block")
    assert reasons["concurrency_64_req_rate_inf_gpus_2_ctx_1_gen_1.json"].startswith("hardware unknown")
    # What to pass is said once, not per point.
    assert [n for n in result.notes if "--hw" in n] == [
        "1 point(s) have no hardware name: pass --hw NAME (InferenceX's RUNNER_TYPE, e.g. --hw h100-disagg, "
        "or set RUNNER_TYPE) to collect them"
    ]
    assert "not valid JSON" in reasons["concurrency_1_req_rate_inf_gpus_2_ctx_1_gen_1.json"]
    assert result.entries == []


def test_validation_rejects_bad_entries() -> None:
    good = collect([DSR1_A], hw="x").entries[0]
    CollectEntry.model_validate(good)
    for bad in (
        {"tput_per_gpu": -1.0},
        {"conc": 0},
        {"prefill_dp_attention": "yes"},
        {"median_ttft": "fast"},
        {"hw": ""},
        {"router": {"name": "pdbench"}},
        {"valid": True},
        {"validity": "valid"},
    ):
        with pytest.raises(ValueError):
            CollectEntry.model_validate(good | bad)


def test_write_new_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "agg.json"
    write_new(out, [{"a": 1}])
    with pytest.raises(FileExistsError):
        write_new(out, [{"b": 2}])
    assert json.loads(out.read_text()) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["agg.json"]  # no temp file left


def test_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "ci" / "agg_dsr1.json"
    r = runner.invoke(app, ["collect", str(DSR1_A), str(DSR1_B), "--out", str(out)], env={"RUNNER_TYPE": "h200-disagg"})
    assert r.exit_code == 0, r.output
    assert r.stdout == f"wrote 5 entries to {out} (2 file(s) skipped)\n"
    assert "skipped" in r.stderr and "invalid point" in r.stderr and "unverified point" in r.stderr
    entries = json.loads(out.read_text())
    assert [(e["hw"], e["conc"]) for e in entries] == [("h200-disagg", c) for c in (64, 128, 64, 128, 256)]
    before = out.read_text()
    r = runner.invoke(app, ["collect", str(DSR1_A), "--out", str(out), "--hw", "x"])
    assert r.exit_code == 2 and "never overwrites" in r.stderr and out.read_text() == before
    r = runner.invoke(
        app, ["collect", str(DSR1_A), "--out", str(tmp_path / "b.json"), "--hw", "x", "--include-invalid"]
    )
    assert r.exit_code == 0 and len(json.loads((tmp_path / "b.json").read_text())) == 3
    r = runner.invoke(
        app, ["collect", str(DSR1_B), "--out", str(tmp_path / "u.json"), "--hw", "x", "--include-unverified"]
    )
    assert r.exit_code == 0, r.output
    assert [e.get("validity") for e in json.loads((tmp_path / "u.json").read_text())] == [None] * 3 + ["unverified"]
    r = runner.invoke(app, ["collect", str(FIXTURES / "vllm-serve"), "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 1 and "nothing written" in r.stderr and not (tmp_path / "c.json").exists()
