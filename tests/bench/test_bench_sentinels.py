"""Sentinel prompts in every point: answered first by a reference instance, then sent through the
target spread over the point, compared token by token; a divergence makes the point invalid
(rule outputs_match) with the prompt, position and both continuations in the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.bench_configs import SENTINEL_PROMPTS, sentinel_config
from helpers.bench_fake_server import FakeServer

from harness import tiny_model
from harness.bench import run_sweep
from harness.bench.sentinels import Answer, first_divergence
from harness.config.benchmark import SentinelSettings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def _sentinel_bodies(srv: FakeServer) -> list[dict]:
    return [b for b in srv.bodies if b.get("return_token_ids")]


def test_matching_sentinels_pass_and_are_recorded(model_dir: str, tmp_path: Path) -> None:
    with FakeServer(token_delay=0.005) as ref, FakeServer(token_delay=0.005) as target:
        (path,) = run_sweep(sentinel_config(model_dir, tmp_path, target.base_url, ref.base_url))
        ref_bodies, target_bodies = list(ref.bodies), list(target.bodies)
    # Precondition: the reference answered exactly the 4 sentinels, and only those.
    assert len(ref_bodies) == 4 and all(b.get("return_token_ids") for b in ref_bodies)
    sent = [b for b in target_bodies if b.get("return_token_ids")]
    assert sorted(b["prompt"] for b in sent) == sorted(b["prompt"] for b in ref_bodies)
    assert all(b["temperature"] == 0 and b["seed"] == 0 and b["max_tokens"] == 8 for b in sent)
    assert len(target_bodies) == SENTINEL_PROMPTS + 4

    result = json.loads(path.read_text())
    # Their latencies are not the point's: it counts the measured requests only.
    assert result["completed"] == SENTINEL_PROMPTS and len(result["ttfts"]) == SENTINEL_PROMPTS
    s = result["sentinels"]
    assert s == {
        "reference": f"prefill-0: whole requests to {ref.base_url}/v1/completions before the measured requests",
        "sent": 4,
        "answered": 4,
        "compared": 4,
        "exact": 4,
        "matched": 4,
        "match_rate": 1.0,
        "first_divergence": [None] * 4,
        "unit": "token",
        "tolerance": {"match_tokens": None, "max_diverged": 0},
        "record": "sentinels/concurrency_2.json",
    }
    rules = {r["name"]: r for r in result["metadata"]["validity"]["rules"]}
    assert rules["outputs_match"]["status"] == "passed" and rules["outputs_match"]["measured"] == 1.0

    record = json.loads((tmp_path / s["record"]).read_text())
    rows = record["sentinels"]
    # Spread over the point: each left once its share of the first N - C measured requests had
    # finished, so the last one left with a whole wave (C = 2) still to come.
    assert [r["sent_after_measured"] for r in rows] == sorted(r["sent_after_measured"] for r in rows)
    assert [r["sent_after_measured"] >= k * (SENTINEL_PROMPTS - 2) / 4 for k, r in enumerate(rows)] == [True] * 4
    assert rows[-1]["sent_after_measured"] <= SENTINEL_PROMPTS - 2
    assert all(r["reference"]["token_ids"] == list(range(8)) == r["answer"]["token_ids"] for r in rows)
    reference = json.loads((tmp_path / "sentinels" / "reference.json").read_text())
    assert [r["prompt_len"] for r in reference["points"]["concurrency_2"]] == [32] * 4


def test_a_diverging_sentinel_makes_the_point_invalid(model_dir: str, tmp_path: Path) -> None:
    def diverge_second(n: int, body: dict) -> str | None:
        seen = [b for b in target.bodies[: n + 1] if b.get("return_token_ids")]
        return "diverge" if body.get("return_token_ids") and len(seen) == 2 else None

    with FakeServer() as ref, FakeServer(policy=diverge_second) as target:
        (path,) = run_sweep(sentinel_config(model_dir, tmp_path, target.base_url, ref.base_url))
    result = json.loads(path.read_text())
    assert result["sentinels"]["matched"] == 3 and result["sentinels"]["first_divergence"].count(3) == 1
    md = result["metadata"]
    assert md["valid"] is False and md["validity"]["verdict"] == "invalid"
    reason = md["validity"]["reasons"][0]
    assert reason.startswith("outputs_match: 3 of 4 sentinel(s) matched the reference in every token")
    assert "first differs at token 3: reference ' t1 t2 t3 t4" in reason and "answer ' t1 t2 t1003 t4" in reason


def test_tolerance_allows_a_late_divergence(model_dir: str, tmp_path: Path) -> None:
    with FakeServer() as ref, FakeServer(policy=lambda n, b: "diverge" if b.get("return_token_ids") else None) as t:
        cfg = sentinel_config(model_dir, tmp_path, t.base_url, ref.base_url, sentinels=SentinelSettings(match_tokens=3))
        (path,) = run_sweep(cfg)
    s = json.loads(path.read_text())["sentinels"]
    # Every sentinel parted at token 3; the first 3 tokens agree, which is what was asked.
    assert s["exact"] == 0 and s["matched"] == 4 and s["first_divergence"] == [3] * 4


def test_without_a_reference_outputs_are_not_checked(model_dir: str, tmp_path: Path) -> None:
    with FakeServer() as target:
        (path,) = run_sweep(sentinel_config(model_dir, tmp_path, target.base_url, None))
        assert not _sentinel_bodies(target)
    result = json.loads(path.read_text())
    rule = {r["name"]: r for r in result["metadata"]["validity"]["rules"]}["outputs_match"]
    assert rule["status"] == "not_checked" and "no reference instance" in rule["detail"]
    assert "sentinels" not in result


def test_sentinels_per_point() -> None:
    s = SentinelSettings()
    assert [s.per_point(n) for n in (8, 200, 1000)] == [4, 4, 20]
    assert SentinelSettings(enabled=False).per_point(1000) == 0


def test_first_divergence_and_text_offsets() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    a = Answer(chunks=[([1], "ab"), ([2, 3], "cd"), ([4], "e")])
    assert a.token_ids == [1, 2, 3, 4] and a.text == "abcde"
    assert [a.text_at_token(p) for p in range(5)] == [0, 2, 2, 4, 5]


def test_references_overlap_the_warmups_and_precede_the_measured_requests(model_dir: str, tmp_path: Path) -> None:
    # A slow reference (8 tokens x 50 ms) and a fast target: the reference answers go on while the
    # first point's warmups run, and its first measured request waits for the last of them.
    with FakeServer(token_delay=0.05) as ref, FakeServer(token_delay=0.002) as target:
        run_sweep(sentinel_config(model_dir, tmp_path, target.base_url, ref.base_url, num_warmups=4))
        plain = [i for i, b in enumerate(target.bodies) if not b.get("return_token_ids")]
        warmups_end = max(target.ended[i] for i in plain[:4])
        first_measured = target.arrived[plain[4]]
        ref_start, ref_end = min(ref.arrived), max(ref.ended.values())
    assert len(ref.arrived) == 4 and len(plain) == 4 + SENTINEL_PROMPTS  # precondition: 4 references, 4 warmups
    assert ref_start < warmups_end < ref_end  # the warmups ran while the reference answered
    assert first_measured >= ref_end


def test_a_decode_reference_answers_with_its_own_cache_salt(model_dir: str, tmp_path: Path) -> None:
    """sentinels.reference=decode: decode-0 answers them whole, salted, so that its prefix cache
    cannot serve the same prompts sent later through the deployment; prefill is not asked."""
    with FakeServer() as prefill, FakeServer() as decode, FakeServer() as target:
        scrape = [f"prefill-0=prefill@{prefill.base_url}", f"decode-0=decode@{decode.base_url}"]
        cfg = sentinel_config(
            model_dir, tmp_path, target.base_url, None, scrape=scrape, sentinels=SentinelSettings(reference="decode")
        )
        (path,) = run_sweep(cfg)
        asked, unasked, sent = _sentinel_bodies(decode), _sentinel_bodies(prefill), _sentinel_bodies(target)
    assert len(asked) == 4 and not unasked  # precondition: the reference was decode's
    assert {b.get("cache_salt") for b in asked} == {"pdbench-sentinel-reference-0"}
    assert len(sent) == 4 and all("cache_salt" not in b for b in sent)
    assert sorted(b["prompt"] for b in sent) == sorted(b["prompt"] for b in asked)
    s = json.loads(path.read_text())["sentinels"]
    assert s["matched"] == 4 and s["reference"] == (
        f"decode-0: whole requests to {decode.base_url}/v1/completions (cache_salt pdbench-sentinel-reference-0) "
        "before the measured requests"
    )


def test_the_default_reference_is_prefill_asked_unsalted(model_dir: str, tmp_path: Path) -> None:
    with FakeServer() as prefill, FakeServer() as decode, FakeServer() as target:
        scrape = [f"decode-0=decode@{decode.base_url}", f"prefill-0=prefill@{prefill.base_url}"]
        cfg = sentinel_config(model_dir, tmp_path, target.base_url, None, scrape=scrape)
        run_sweep(cfg)
        asked, unasked = _sentinel_bodies(prefill), _sentinel_bodies(decode)
    assert len(asked) == 4 and not unasked
    assert all("cache_salt" not in b for b in asked)
