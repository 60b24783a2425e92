"""InferenceX's ingestion contract, written out from `utils/process_result.py` (read at 843c6254).

The keys and types an `agg_*.json` entry has, the workflow's environment for a result file, and
`assert_inferencex_contract`, which the contract tests and the end-to-end tests apply to the
result files a job wrote (and InferenceX's own script, where PDBENCH_INFERENCEX_PROCESS_RESULT
names it).
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

from harness.report.collect import collect

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
