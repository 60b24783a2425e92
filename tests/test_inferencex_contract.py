"""InferenceX's ingestion contract, checked on real result files.

InferenceX (github.com/SemiAnalysisAI/InferenceX, read at 843c6254) turns each benchmark result
into an `agg_*.json` entry with `utils/process_result.py`. Its workflows run it so:

- Multinode (`benchmark-multinode-tmpl.yml`): the runner copies each result to
  `${RESULT_FILENAME}_<basename>.json`; a loop over `${RESULT_FILENAME}_*.json` reads the GPU split
  from the name with sed (the last `_gpus_<N>`, `_ctx_<P>`, `_gen_<D>`; no ctx/gen: P = N, D = 0;
  no `_gpus_`: the file is skipped) and runs the script with RESULT_FILENAME=<name without .json>,
  IS_MULTINODE=true, PREFILL_GPUS, DECODE_GPUS.
- Single node (`benchmark-tmpl.yml`): one `${RESULT_FILENAME}.json`, IS_MULTINODE unset.

What the script needs:
- env, always: RUNNER_TYPE, FRAMEWORK, PRECISION, SPEC_DECODING, RESULT_FILENAME, ISL, OSL (int),
  DISAGG ("true" only with IS_MULTINODE=true), MODEL_PREFIX, IMAGE; optional RECIPE_FINGERPRINT,
  KV_P2P_TRANSFER, ROUTER_METADATA (JSON object of exactly non-empty string `name` and `version`).
- env, multinode: PREFILL_GPUS, DECODE_GPUS, PREFILL_NUM_WORKERS, PREFILL_TP, PREFILL_EP,
  DECODE_NUM_WORKERS, DECODE_TP, DECODE_EP (ints), PREFILL_DP_ATTN, DECODE_DP_ATTN (text as is);
  optional {PREFILL,DECODE}_{PP_SIZE,DCP_SIZE,PCP_SIZE} (ints > 0, default 1), PREFILL_HARDWARE and
  DECODE_HARDWARE (both or neither). P + D > 0 and P > 0.
- env, single node: TP, EP_SIZE (ints), DP_ATTENTION; optional PP_SIZE, DCP_SIZE, PCP_SIZE (> 0);
  GPUs = TP * PP * PCP.
- the file: `max_concurrency` (int()), `model_id`, `total_token_throughput`, `output_throughput`
  (float()); and every top-level key ending in "ms" is float(value) / 1000 under the key without
  "_ms", every top-level key containing "tpot" also 1000 / float(value) under "tpot" -> "intvty".
  So: no null, text, list or object under such a key, and no TPOT value of 0.
- per GPU, multinode: total / (P + D), output / D (over P + D when D = 0), input (total - output)
  / P; decode parallelism zeroed (tp, ep 0; pp, dcp, pcp 1) when D = 0. Single node: all over GPUs.
- best effort afterwards (power accounting, never fails the step unless REQUIRE_POWER): numeric
  `benchmark_start_time_unix` < `benchmark_end_time_unix` within max(0.5 s, 1 %) of `duration`, and
  integer `completed`, `total_input_tokens`, `total_output_tokens`.

`ingest` below is this contract written out (not InferenceX's code); `assert_inferencex_contract`
applies it, and the equality with `pdbench collect`, to real files and is meant for other tests
(e.g. on the run directories of the end-to-end tests). With PDBENCH_INFERENCEX_PROCESS_RESULT set to
a checkout's utils/process_result.py it also runs that script on every file and compares.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.report.collect import collect

pytestmark = pytest.mark.timeout(120)

FIXTURES = Path(__file__).parent / "fixtures" / "results"
PDBENCH_FIXTURE_RUNS = [
    FIXTURES / "dsr1-fp8-2p4d" / "20261201T100000Z-aaa111",
    FIXTURES / "dsr1-fp8-2p4d" / "20261202T100000Z-bbb222",
    FIXTURES / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34",
    FIXTURES / "tiny-fp32-cpu-nixl-1p2d" / "20261122T034324Z-a3eb41",
]
IX_FIXTURE_RUN = FIXTURES / "inferencex-dsr1-fp8-mi355x-isl_1024_osl_1024"
# What InferenceX's CI prefixes each copied result with (RESULT_FILENAME of the multinode job).
CI_PREFIX = "pdbench_fp8_vllm-disagg_prefill-tp8-pp1-dcp1-pcp1-ep1-dpfalse-nw1_disagg-true_spec-none_conc8_runner-0"

BASE_KEYS = (
    "hw",
    "conc",
    "image",
    "model",
    "infmax_model_prefix",
    "framework",
    "precision",
    "spec_decoding",
    "disagg",
    "recipe_fingerprint",
    "isl",
    "osl",
    "router",
    "kv_p2p_transfer",
)
MULTINODE_KEYS = (
    "is_multinode",
    "prefill_tp",
    "prefill_pp",
    "prefill_dcp_size",
    "prefill_pcp_size",
    "prefill_ep",
    "prefill_dp_attention",
    "prefill_num_workers",
    "decode_tp",
    "decode_pp",
    "decode_dcp_size",
    "decode_pcp_size",
    "decode_ep",
    "decode_dp_attention",
    "decode_num_workers",
    "num_prefill_gpu",
    "num_decode_gpu",
    "tput_per_gpu",
    "output_tput_per_gpu",
    "input_tput_per_gpu",
    "prefill_hw",
    "decode_hw",
)
SINGLE_NODE_KEYS = (
    "is_multinode",
    "tp",
    "pp",
    "dcp_size",
    "pcp_size",
    "ep",
    "dp_attention",
    "tput_per_gpu",
    "output_tput_per_gpu",
    "input_tput_per_gpu",
)
# Keys pdbench collect adds for a point kept on request; InferenceX has no notion of them.
PDBENCH_ONLY = ("valid", "validity")


class ContractError(AssertionError):
    pass


# --- the contract ----------------------------------------------------------------------------------


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def workflow_split(name: str) -> tuple[int, int] | None:
    """(prefill, decode) GPUs as the multinode workflow's sed reads a file name; None: it skips it."""
    last = lambda rx: (re.findall(rx, name) or [""])[-1]  # noqa: E731 - sed's greedy `.*` takes the last
    gpus, ctx, gen = last(r"_gpus_(\d+)"), last(r"_ctx_(\d*)"), last(r"_gen_(\d*)")
    if not gpus:
        return None
    if not ctx or not gen:
        return int(gpus), 0
    return int(ctx), int(gen)


def check_result_file(path: Path, power: bool = True) -> list[str]:
    """What in this file (its keys, values and name) would break InferenceX's ingestion."""
    problems: list[str] = []
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        return [f"{path.name}: not a JSON object"]
    if isinstance(data.get("max_concurrency"), bool) or not isinstance(data.get("max_concurrency"), int):
        problems.append(f"max_concurrency: not an integer ({data.get('max_concurrency')!r})")
    if not isinstance(data.get("model_id"), str):
        problems.append("model_id: missing")
    for key in ("total_token_throughput", "output_throughput"):
        if not _number(data.get(key)):
            problems.append(f"{key}: not a finite number ({data.get(key)!r})")
    fixed = set(BASE_KEYS + MULTINODE_KEYS + SINGLE_NODE_KEYS)
    for key, value in data.items():
        if key.endswith("ms") or "tpot" in key:
            if not _number(value):
                problems.append(f"{key}: not a finite number ({value!r}); InferenceX reads it with float()")
            elif "tpot" in key and value == 0:
                problems.append(f"{key}: 0; InferenceX computes 1000 / {key}")
            derived = {key.replace("_ms", "")} if key.endswith("ms") else set()
            if "tpot" in key:
                derived.add(key.replace("_ms", "").replace("tpot", "intvty"))
            if derived & fixed:
                problems.append(f"{key}: becomes {sorted(derived & fixed)}, overwriting InferenceX's own key")
    split = workflow_split(path.name)
    if split is not None and split[0] <= 0:
        problems.append(f"{path.name}: no prefill GPU in the name; InferenceX's multinode branch refuses it")
    if power:
        start, end, duration = (
            data.get(k) for k in ("benchmark_start_time_unix", "benchmark_end_time_unix", "duration")
        )
        if not all(_number(v) for v in (start, end, duration)):
            problems.append(
                f"power window: benchmark_start/end_time_unix, duration not numbers ({start!r}, {end!r}, {duration!r})"
            )
        elif data.get("completed"):  # a point that completed nothing has no window to account
            window = end - start
            if window <= 0 or abs(duration - window) > max(0.5, window * 0.01):
                problems.append(f"power window: end - start = {window!r} s vs duration {duration!r} s")
        for key in ("completed", "total_input_tokens", "total_output_tokens"):
            if isinstance(data.get(key), bool) or not isinstance(data.get(key), int):
                problems.append(f"{key}: not an integer ({data.get(key)!r})")
    return problems


def _env_int(env: dict[str, str], name: str, default: str | None = None) -> int:
    raw = env.get(name, default)
    if raw is None:
        raise ContractError(f"env {name} is required")
    try:
        return int(raw)
    except ValueError:
        raise ContractError(f"env {name}={raw!r} is not an integer") from None


def ingest(data: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The agg entry InferenceX's process_result.py makes of `data` under `env` (power keys aside).
    Raises ContractError, naming the env variable or key, where the script would fail."""
    missing = [
        v
        for v in (
            "RUNNER_TYPE",
            "FRAMEWORK",
            "PRECISION",
            "SPEC_DECODING",
            "RESULT_FILENAME",
            "ISL",
            "OSL",
            "DISAGG",
            "MODEL_PREFIX",
            "IMAGE",
        )
        if v not in env
    ]
    if missing:
        raise ContractError(f"env {', '.join(missing)} required")
    disagg = env["DISAGG"].lower() == "true"
    try:
        conc = int(data["max_concurrency"])
        total, output = float(data["total_token_throughput"]), float(data["output_throughput"])
        model = data["model_id"]
    except (KeyError, TypeError, ValueError) as e:
        raise ContractError(f"result: {type(e).__name__}: {e}") from None
    out: dict[str, Any] = {
        "hw": env["RUNNER_TYPE"],
        "conc": conc,
        "image": env["IMAGE"],
        "model": model,
        "infmax_model_prefix": env["MODEL_PREFIX"],
        "framework": env["FRAMEWORK"],
        "precision": env["PRECISION"],
        "spec_decoding": env["SPEC_DECODING"],
        "disagg": disagg,
        "recipe_fingerprint": env.get("RECIPE_FINGERPRINT", ""),
        "isl": _env_int(env, "ISL"),
        "osl": _env_int(env, "OSL"),
    }
    if env.get("ROUTER_METADATA", "") not in ("", "null"):
        router = json.loads(env["ROUTER_METADATA"])
        if not (
            isinstance(router, dict)
            and set(router) == {"name", "version"}
            and all(isinstance(v, str) and v for v in router.values())
        ):
            raise ContractError(f"env ROUTER_METADATA: exactly non-empty name and version, got {router!r}")
        out["router"] = router
    if env.get("KV_P2P_TRANSFER"):
        out["kv_p2p_transfer"] = env["KV_P2P_TRANSFER"]
    if env.get("IS_MULTINODE", "false").lower() == "true":
        if bool(env.get("PREFILL_HARDWARE")) != bool(env.get("DECODE_HARDWARE")):
            raise ContractError("env PREFILL_HARDWARE and DECODE_HARDWARE: both or neither")
        p, d = _env_int(env, "PREFILL_GPUS"), _env_int(env, "DECODE_GPUS")
        sizes = {
            f"{role}_{k}": _env_int(env, f"{role.upper()}_{k.upper()}{'_SIZE' if k == 'pp' else ''}", "1")
            for role in ("prefill", "decode")
            for k in ("pp", "dcp_size", "pcp_size")
        }
        if min(sizes.values()) <= 0:
            raise ContractError(f"env PP/DCP/PCP sizes must be positive: {sizes}")
        if p + d <= 0 or p <= 0:
            raise ContractError(f"PREFILL_GPUS={p}, DECODE_GPUS={d}: needs a prefill GPU")
        dp_attn = {r: env.get(f"{r.upper()}_DP_ATTN") for r in ("prefill", "decode")}
        if None in dp_attn.values():
            raise ContractError("env PREFILL_DP_ATTN and DECODE_DP_ATTN required")
        has_d = d > 0
        out |= {
            "is_multinode": True,
            "prefill_tp": _env_int(env, "PREFILL_TP"),
            "prefill_pp": sizes["prefill_pp"],
            "prefill_dcp_size": sizes["prefill_dcp_size"],
            "prefill_pcp_size": sizes["prefill_pcp_size"],
            "prefill_ep": _env_int(env, "PREFILL_EP"),
            "prefill_dp_attention": dp_attn["prefill"],
            "prefill_num_workers": _env_int(env, "PREFILL_NUM_WORKERS"),
            "decode_tp": _env_int(env, "DECODE_TP") if has_d else 0,
            "decode_pp": sizes["decode_pp"] if has_d else 1,
            "decode_dcp_size": sizes["decode_dcp_size"] if has_d else 1,
            "decode_pcp_size": sizes["decode_pcp_size"] if has_d else 1,
            "decode_ep": _env_int(env, "DECODE_EP") if has_d else 0,
            "decode_dp_attention": dp_attn["decode"],
            "decode_num_workers": _env_int(env, "DECODE_NUM_WORKERS"),
            "num_prefill_gpu": p,
            "num_decode_gpu": d,
            "tput_per_gpu": total / (p + d),
            "output_tput_per_gpu": output / (d if has_d else p + d),
            "input_tput_per_gpu": (total - output) / p,
        }
        if env.get("PREFILL_HARDWARE"):
            out |= {"prefill_hw": env["PREFILL_HARDWARE"], "decode_hw": env["DECODE_HARDWARE"]}
    else:
        if disagg:
            raise ContractError("DISAGG=true needs IS_MULTINODE=true")
        tp, pp, pcp = _env_int(env, "TP"), _env_int(env, "PP_SIZE", "1"), _env_int(env, "PCP_SIZE", "1")
        dcp = _env_int(env, "DCP_SIZE", "1")
        if min(pp, dcp, pcp) <= 0:
            raise ContractError("env PP_SIZE, DCP_SIZE, PCP_SIZE must be positive")
        if "DP_ATTENTION" not in env:
            raise ContractError("env DP_ATTENTION required")
        gpus = tp * pp * pcp
        if gpus == 0:
            raise ContractError("TP * PP_SIZE * PCP_SIZE is 0")
        out |= {
            "is_multinode": False,
            "tp": tp,
            "pp": pp,
            "dcp_size": dcp,
            "pcp_size": pcp,
            "ep": _env_int(env, "EP_SIZE"),
            "dp_attention": env["DP_ATTENTION"],
            "tput_per_gpu": total / gpus,
            "output_tput_per_gpu": output / gpus,
            "input_tput_per_gpu": (total - output) / gpus,
        }
    for key, value in data.items():
        try:
            if key.endswith("ms"):
                out[key.replace("_ms", "")] = float(value) / 1000.0
            if "tpot" in key:
                out[key.replace("_ms", "").replace("tpot", "intvty")] = 1000.0 / float(value)
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise ContractError(f"{key}={value!r}: {type(e).__name__}: {e}") from None
    return out


def inferencex_env(path: Path, hw: str, multinode: bool = True) -> dict[str, str]:
    """The env InferenceX's workflow would give process_result.py for this pdbench file, from its
    metadata (what a CI config would say) and, multinode, the split its sed reads from `path`'s name.
    Values pdbench does not know (a plain `pdbench bench` of some server) get neutral stand-ins."""
    data = json.loads(path.read_text())
    md = data.get("metadata") or {}
    flag = lambda v: "true" if v is True or str(v).lower() == "true" else "false"  # noqa: E731
    env = {
        "RUNNER_TYPE": hw,
        "FRAMEWORK": md.get("framework") or "vllm-disagg",
        "PRECISION": md.get("precision") or "unknown",
        "SPEC_DECODING": md.get("spec_decoding") or "none",
        "RESULT_FILENAME": path.name[: -len(".json")],
        "ISL": str(data.get("random_input_len") or md.get("isl") or 1),
        "OSL": str(data.get("random_output_len") or md.get("osl") or 1),
        "DISAGG": flag(multinode and md.get("disagg", True)),
        "MODEL_PREFIX": md.get("model_prefix") or md.get("model") or data["model_id"],
        "IMAGE": md.get("image") or "",
        "RECIPE_FINGERPRINT": md.get("recipe_fingerprint") or "",
        "KV_P2P_TRANSFER": md.get("connector") or "",
    }
    if md.get("proxy") == "pdbench" and md.get("pdbench_version"):
        env["ROUTER_METADATA"] = json.dumps({"name": "pdbench", "version": str(md["pdbench_version"])})
    elif md.get("proxy") and md.get("proxy_version"):
        env["ROUTER_METADATA"] = json.dumps({"name": str(md["proxy"]), "version": str(md["proxy_version"])})
    if not multinode:
        return env | {
            "TP": str(md.get("gpus") or md.get("tp") or 1),
            "EP_SIZE": str(md.get("ep") or 1),
            "DP_ATTENTION": flag(md.get("dp_attention")),
        }
    split = workflow_split(path.name)
    assert split is not None, f"{path.name}: no _gpus_ in the name; InferenceX's multinode workflow skips it"
    env |= {"IS_MULTINODE": "true", "PREFILL_GPUS": str(split[0]), "DECODE_GPUS": str(split[1])}
    if md.get("disagg") is False and md.get("tp") is not None:
        # A pdbench aggregated baseline: its CI config describes its workers as prefill-only ones.
        md = md | {
            "prefill_num_workers": md.get("num_workers", 1),
            "prefill_tp": md["tp"],
            "prefill_ep": md.get("ep", 1),
            "prefill_dp_attention": md.get("dp_attention"),
            "decode_num_workers": 0,
        }
    for role, gpus in (("prefill", split[0]), ("decode", split[1])):
        up = role.upper()
        env |= {
            f"{up}_NUM_WORKERS": str(md.get(f"{role}_num_workers", 1 if gpus else 0)),
            f"{up}_TP": str(md.get(f"{role}_tp", gpus)),
            f"{up}_EP": str(md.get(f"{role}_ep", 1)),
            f"{up}_DP_ATTN": flag(md.get(f"{role}_dp_attention")),
        }
        for k in ("pp", "dcp_size", "pcp_size"):
            if md.get(f"{role}_{k}"):
                env[f"{up}_{k.upper()}{'_SIZE' if k == 'pp' else ''}"] = str(md[f"{role}_{k}"])
    return env


def run_upstream(script: Path, result: Path, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    """Run InferenceX's process_result.py on `result` as its workflow does; its agg dict."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(result, workdir / f"{env['RESULT_FILENAME']}.json")
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
    r = subprocess.run(
        [sys.executable, str(script)], cwd=workdir, env=keep | env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, f"process_result.py failed on {result.name}:\n{r.stderr[-3000:]}"
    return json.loads((workdir / f"agg_{env['RESULT_FILENAME']}.json").read_text())


def result_files(run: Path) -> list[Path]:
    run = Path(run)
    return [run] if run.is_file() else sorted(run.glob("concurrency_*.json"))


def assert_inferencex_contract(run: Path, hw: str = "test-hw", power: bool = True) -> list[dict[str, Any]]:
    """Check every pdbench result file of a run directory (or one file) against InferenceX's
    ingestion: the file's keys and name, the agg entry through the multinode workflow (files with a
    split) or the single-node one (others), and `pdbench collect`'s entry for it where collect writes
    one. Returns the agg entries. For other tests, e.g. on an end-to-end run's directory."""
    files = result_files(run)
    assert files, f"{run}: no concurrency_*.json result files"
    entries = []
    script = os.environ.get("PDBENCH_INFERENCEX_PROCESS_RESULT")
    for path in files:
        problems = check_result_file(path, power=power)
        assert not problems, f"{path.name} would break InferenceX's ingestion:\n  " + "\n  ".join(problems)
        data = json.loads(path.read_text())
        # The CI's copy is named ${RESULT_FILENAME}_<basename>; its sed reads the split from that.
        multinode = workflow_split(f"{CI_PREFIX}_{path.name}") is not None
        env = inferencex_env(path, hw, multinode)
        env["RESULT_FILENAME"] = f"{CI_PREFIX}_{env['RESULT_FILENAME']}"
        agg = ingest(data, env)
        if script:
            upstream = run_upstream(
                Path(script),
                path,
                env,
                Path(os.environ.get("TMPDIR", "/tmp")) / "pdbench-ix" / path.parent.name / path.stem,
            )
            assert {k: upstream.get(k) for k in agg} == agg, f"{path.name}: upstream differs from the contract"
        kept = collect([path], hw=hw, include_invalid=True, include_unverified=True).entries
        if kept and multinode:  # collect writes the multinode disaggregated schema only
            (entry,) = kept
            mine = {k: v for k, v in entry.items() if k not in PDBENCH_ONLY}
            assert list(mine) == list(agg) and mine == agg, (
                f"{path.name}: collect differs from InferenceX's ingestion: "
                + str({k: (mine.get(k), agg.get(k)) for k in set(mine) | set(agg) if mine.get(k) != agg.get(k)})
            )
        entries.append(agg)
    return entries


# --- fixtures: real files ---------------------------------------------------------------------------


@pytest.mark.parametrize("run", PDBENCH_FIXTURE_RUNS, ids=lambda p: p.parent.name + "/" + p.name)
def test_pdbench_fixture_runs(run: Path) -> None:
    # Recorded before the power window existed in pdbench's files, hence power=False.
    entries = assert_inferencex_contract(run, power=False)
    for agg, path in zip(entries, result_files(run), strict=False):
        data = json.loads(path.read_text())
        split = workflow_split(path.name)
        assert (agg["num_prefill_gpu"], agg["num_decode_gpu"]) == split
        assert agg["median_intvty"] == 1000.0 / data["median_tpot_ms"]
        assert agg["p99.9_e2el"] == data["p99.9_e2el_ms"] / 1000.0


def test_inferencex_fork_files_pass_the_encoded_contract() -> None:
    # A sanity check of the encoding: InferenceX's own benchmark client's files pass it.
    for path in sorted(IX_FIXTURE_RUN.glob("*.json")):
        assert check_result_file(path, power=False) == []
        env = inferencex_env(path, "mi355x-disagg")
        assert (env["PREFILL_GPUS"], env["DECODE_GPUS"]) == ("8", "16")
        agg = ingest(json.loads(path.read_text()), env)
        assert agg["num_prefill_gpu"] == 8 and agg["tput_per_gpu"] > 0


def test_the_checks_catch_what_breaks_inferencex(tmp_path: Path) -> None:
    good = json.loads(result_files(PDBENCH_FIXTURE_RUNS[0])[0].read_text())
    name = "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json"
    cases = [
        ({"goodput_slos_ms": None}, name, "goodput_slos_ms: not a finite number (None)"),  # pdbench before #11
        ({"goodput_slos_ms": {"ttft": 5}}, name, "goodput_slos_ms: not a finite number"),
        ({"std_tpot_ms": 0.0}, name, "std_tpot_ms: 0; InferenceX computes 1000 / std_tpot_ms"),
        ({"conc_ms": 1.0}, name, "overwriting InferenceX's own key"),
        ({"max_concurrency": None}, name, "max_concurrency: not an integer"),
        ({}, "concurrency_8_req_rate_inf_gpus_1_ctx_0_gen_1.json", "no prefill GPU"),
    ]
    for change, fname, needle in cases:
        path = tmp_path / fname
        path.write_text(json.dumps(good | change))
        problems = check_result_file(path, power=False)
        assert any(needle in p for p in problems), (change, problems)
        path.unlink()
    env = inferencex_env(result_files(PDBENCH_FIXTURE_RUNS[0])[0], "x")
    with pytest.raises(ContractError, match=r"goodput_slos_ms=None: TypeError"):
        ingest(good | {"goodput_slos_ms": None}, env)
    with pytest.raises(ContractError, match=r"std_tpot_ms=0.0: ZeroDivisionError"):
        ingest(good | {"std_tpot_ms": 0.0}, env)
    with pytest.raises(ContractError, match="needs a prefill GPU"):
        ingest(good, env | {"PREFILL_GPUS": "0"})
    with pytest.raises(ContractError, match="DISAGG=true needs IS_MULTINODE"):
        ingest(
            good,
            {k: v for k, v in env.items() if k != "IS_MULTINODE"}
            | {"TP": "8", "EP_SIZE": "1", "DP_ATTENTION": "false"},
        )


def test_workflow_split_reads_names_as_the_sed_does() -> None:
    assert workflow_split(f"{CI_PREFIX}_concurrency_8_req_rate_inf_gpus_24_ctx_8_gen_16.json") == (8, 16)
    assert workflow_split(f"{CI_PREFIX}_concurrency_8_req_rate_2.5_gpus_8.json") == (8, 0)
    assert workflow_split(f"{CI_PREFIX}_concurrency_8_req_rate_inf.json") is None


# --- files the project's own writer makes ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from harness import tiny_model

    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


RECIPES = sorted(p.stem for p in (Path(__file__).parents[1] / "recipes").glob("*.yaml"))


def _recipe_bench_config(recipe: str, tmp: Path) -> dict[str, Any]:
    """The bench.json the job of `recipe` runs (its metadata and GPU split), as rendered."""
    from harness.config import load_recipe
    from harness.render import RenderContext, render_job

    out = tmp / f"render-{recipe}"
    out.mkdir()
    render_job(
        load_recipe(recipe),
        out,
        RenderContext(run_dir=str(out), root="/opt/pdbench", python="python", git_commit="0" * 40),
    )
    # An aggregated-only job (one instance as a reference) runs only the aggregated phase's client.
    name = "bench.json" if (out / "bench.json").is_file() else "bench-aggregated.json"
    return json.loads((out / name).read_text())


def _sweep(model_dir: str, result_dir: Path, base_url: str, **kw: Any) -> list[Path]:
    from harness.bench import ClientConfig, run_sweep_detailed

    fields = dict(
        base_url=base_url,
        model="tiny",
        tokenizer=model_dir,
        isl=16,
        osl=4,
        concurrency=[2],
        num_prompts=4,
        num_warmups=0,
        result_dir=str(result_dir),
        health_check_interval_s=0,
    )
    outcomes = run_sweep_detailed(ClientConfig(**(fields | kw)))
    assert all(o.path is not None for o in outcomes), [o.error for o in outcomes]
    return [o.path for o in outcomes]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_point_passes(recipe: str, model_dir: str, tmp_path: Path) -> None:
    # Each recipe's own metadata and split, completions without goodput and chat with goodput.
    from bench_fake_server import FakeServer

    bench = _recipe_bench_config(recipe, tmp_path)
    split = ("prefill_gpus", "decode_gpus") if "prefill_gpus" in bench else ("gpus",)
    common = {k: bench[k] for k in (*split, "metadata")}
    with FakeServer() as srv:
        a = _sweep(model_dir, tmp_path / "a", srv.base_url, concurrency=[1, 2], **common)
        b = _sweep(
            model_dir, tmp_path / "b", srv.base_url, endpoint="chat", goodput={"ttft": 60000, "tpot": 60000}, **common
        )
    for run in (tmp_path / "a", tmp_path / "b"):
        entries = assert_inferencex_contract(run)
        assert all(e["num_prefill_gpu"] == bench.get("prefill_gpus", bench.get("gpus")) for e in entries), entries
    rb = json.loads(b[0].read_text())
    assert rb["goodput_slos"] == {"ttft_ms": 60000, "tpot_ms": 60000} and rb["backend"] == "openai-chat"
    assert json.loads(a[0].read_text())["goodput_slos"] is None
    # collect's entries are the ingested ones (the points are unverified: nothing was scraped).
    assert collect([tmp_path / "a"], hw="x").entries == []
    assert len(collect([tmp_path / "a"], hw="x", include_unverified=True).entries) == 2


def test_degenerate_points_pass(model_dir: str, tmp_path: Path) -> None:
    # Every request failed (no TPOT sample: vLLM writes 0 there), and one-token outputs.
    from bench_fake_server import FakeServer

    with FakeServer(policy=lambda n, b: "500") as srv:
        (failed,) = _sweep(model_dir, tmp_path / "f", srv.base_url, prefill_gpus=1, decode_gpus=2)
    with FakeServer() as srv:
        (one,) = _sweep(
            model_dir,
            tmp_path / "o",
            srv.base_url,
            osl=1,
            prefill_gpus=1,
            decode_gpus=1,
            scrape=["decode-0=decode@" + srv.base_url],
        )  # no /metrics there: unverified
    for path in (failed, one):
        (agg,) = assert_inferencex_contract(path)
        data = json.loads(path.read_text())
        assert not any("tpot" in k for k in data) and not any("intvty" in k for k in agg)
    # A point cut short with requests never sent: its not_sent count is a plain integer key.
    with FakeServer(policy=lambda n, b: "hang" if n == 1 else None) as srv:
        (cut,) = _sweep(
            model_dir,
            tmp_path / "c",
            srv.base_url,
            concurrency=[1],
            num_prompts=3,
            point_timeout_s=1.0,
            prefill_gpus=1,
            decode_gpus=1,
        )
    data = json.loads(cut.read_text())
    assert (data["completed"], data["failed"], data["not_sent"]) == (1, 1, 1) and data["stop_reason"]
    assert_inferencex_contract(cut)
    # No request completed: no latency statistic at all (n/a, where vLLM writes 0s).
    data = json.loads(failed.read_text())
    assert data["latency_stats"] == "n/a: no measured request completed" and not data["zero_per_token_stats"]
    assert not [k for k in data if k.endswith("_ms")]
    assert "median_tpot_ms" in json.loads(one.read_text())["zero_per_token_stats"]
    md = json.loads(one.read_text())["metadata"]
    assert md["valid"] is None and md["validity"]["verdict"] == "unverified"
    assert {r["name"]: r["status"] for r in md["validity"]["rules"]}["kv_transferred"] == "not_checked"


def test_one_server_without_a_split(model_dir: str, tmp_path: Path) -> None:
    """One aggregated server: with --gpus N the file name says `_gpus_N`, which InferenceX's multinode
    workflow reads as N GPUs of one worker (prefill N, decode 0); its single-node branch gets the same
    per-GPU figures from TP = N. Without a GPU count the name has no `_gpus_`: the multinode workflow
    skips the file rather than invent per-GPU figures, and the single-node one needs TP from its CI."""
    from bench_fake_server import FakeServer

    from harness.report.normalise import per_gpu

    with FakeServer() as srv:
        (agg_file,) = _sweep(model_dir, tmp_path / "g", srv.base_url, gpus=8)
        (unknown,) = _sweep(model_dir, tmp_path / "u", srv.base_url, endpoint="chat", goodput={"e2el": 60000})
    data = json.loads(agg_file.read_text())
    (multi,) = assert_inferencex_contract(agg_file)
    single = ingest(data, inferencex_env(agg_file, "x", multinode=False))
    expected = per_gpu(data["total_token_throughput"], data["output_throughput"], 8, 0)
    for e in (multi, single):
        assert (e["tput_per_gpu"], e["output_tput_per_gpu"], e["input_tput_per_gpu"]) == pytest.approx(expected)
        assert e["disagg"] is False
    assert multi["num_prefill_gpu"] == 8 and multi["num_decode_gpu"] == 0 and single["tp"] == 8
    assert workflow_split(f"{CI_PREFIX}_{unknown.name}") is None
    (single_unknown,) = assert_inferencex_contract(unknown)  # keys pass; per-GPU figures need the CI's TP
    assert single_unknown["is_multinode"] is False
    md = json.loads(unknown.read_text())["metadata"]
    assert (md["disagg"], md["gpu_split"]) == (False, "unknown")
    # collect writes the disaggregated schema only; it says why it leaves these out.
    result = collect([tmp_path / "g", tmp_path / "u"], hw="x", include_unverified=True)
    assert result.entries == [] and all("not a disaggregated point" in s.reason for s in result.skipped)


def test_collect_holds_what_inferencex_computes() -> None:
    # The valid, disaggregated fixture points: collect keeps them by default; equal to ingestion.
    run = PDBENCH_FIXTURE_RUNS[0]
    entries = {e["conc"]: e for e in collect([run], hw="test-hw").entries}
    assert sorted(entries) == [64, 128]
    for path in result_files(run):
        data = json.loads(path.read_text())
        if data["max_concurrency"] in entries:
            env = inferencex_env(path, "test-hw")
            assert entries[data["max_concurrency"]] == ingest(data, env)
            assert entries[data["max_concurrency"]]["tput_per_gpu"] == data["total_token_throughput"] / 48


def test_aggregated_baseline_points_pass_and_are_collected(model_dir: str, tmp_path: Path) -> None:
    """The baseline of tiny-fp32-cpu-nixl-1p2d-vs-agg (3 instances of TP 1) as its job writes it:
    InferenceX's multinode workflow reads `_gpus_3` as 3 prefill-only GPUs, its single-node branch
    gets the same per-GPU figures from TP = 3; collect writes the same entry, disagg false."""
    from bench_fake_server import FakeServer

    from harness.config import load_recipe
    from harness.render import RenderContext, render_job

    out = tmp_path / "render"
    out.mkdir()
    ctx = RenderContext(run_dir=str(out), root="/opt/pdbench", python="python", git_commit="0" * 40)
    render_job(load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg"), out, ctx)
    bench = json.loads((out / "bench-aggregated.json").read_text())
    assert bench["gpus"] == 3 and "prefill_gpus" not in bench
    with FakeServer() as srv:
        (path,) = _sweep(model_dir, tmp_path / "a", srv.base_url, gpus=3, metadata=bench["metadata"])
    assert path.name == "concurrency_2_req_rate_inf_gpus_3.json"
    (multi,) = assert_inferencex_contract(tmp_path / "a")
    data = json.loads(path.read_text())
    single = ingest(data, inferencex_env(path, "x", multinode=False))
    assert multi["disagg"] is False and single["tp"] == 3
    assert (
        multi["tput_per_gpu"]
        == pytest.approx(single["tput_per_gpu"])
        == pytest.approx(data["total_token_throughput"] / 3)
    )
    (entry,) = collect([tmp_path / "a"], hw="x", include_unverified=True).entries
    assert (entry["disagg"], entry["framework"], entry["num_prefill_gpu"], entry["num_decode_gpu"]) == (
        False,
        "vllm",
        3,
        0,
    )
    assert (entry["prefill_tp"], entry["prefill_num_workers"], "kv_p2p_transfer" in entry) == (1, 3, False)
