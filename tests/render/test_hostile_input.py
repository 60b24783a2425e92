"""Hostile recipe and catalogue values never become code in job.slurm or server.sh.

Every string field of the schema (found by walking the pydantic models) gets shell
metacharacters, quotes, newlines and control characters. Each value is either refused at
load, with an error that names its key, or rendered so that the scripts parse (`bash -n`)
and, run in a sandbox of stub executables, create no marker file and hand the value to the
stubs intact, as one argument or one environment value.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from harness.config import ConfigError, load_recipe
from harness.config.schema import Catalogue, ModelSpec, Recipe
from harness.render import RenderContext, render_job

RUNTIMES = ["docker", "podman", "enroot", "apptainer", "none"]
MODEL = {
    "hf_id": "org/model",
    "precision": "fp8",
    "tokenizer": "org/model",
    "served_model_name": "served",
    "max_model_len": 4096,
    "prefill_flags": {"dtype": "bfloat16"},
    "decode_flags": {"dtype": "bfloat16"},
    "env": {"MODEL_ENV": "1"},
    "prefill_env": {"P_ENV": "1"},
    "decode_env": {"D_ENV": "1"},
}
RECIPE: dict[str, Any] = {
    "name": "hostile",
    "description": "a recipe",
    "model": "m",
    "container": {"runtime": "docker", "image": "img", "mounts": {"/src": "/dst"}},
    "topology": {
        "gpus_per_node": 0,
        "nic_detection": True,
        "prefill": {"port": 8100, "cpu_bind": ["0"], "env": {"R_ENV": "1"}, "flags": {"seed": 1}},
        "decode": {"port": 8200, "cpu_bind": ["1"], "env": {"R_ENV": "1"}, "flags": {"seed": 1}},
        "aggregated": {"nodes": 2, "workers": 2, "port": 8300, "env": {"R_ENV": "1"}, "flags": {"seed": 1}},
    },
    # MoRI-IO: its kv-transfer-config holds a run-time address, so recipe values in it
    # go through the double-quoted JSON word, the harder case.
    "connector": {"name": "moriio", "extra_config": {"k": "v"}},
    "benchmark": {"isl": 8, "osl": 8, "concurrency": [1]},
    "slurm": {
        "job_name": "j",
        "partition": "p",
        "account": "a",
        "qos": "q",
        "time_limit": "00:10:00",
        "nodelist": "n",
        "exclude": "x",
        "reservation": "r",
        "constraint": "c",
        "extra_sbatch": ["--mem=0"],
    },
    "env": {"JOB_ENV": "1"},
}


# --- every string slot of the schema -------------------------------------------------

Slot = tuple[str, tuple[str, ...]]  # (kind, path): kind is str, item, key or value


def _unwrap(tp: Any) -> list[Any]:
    """The alternatives of a type, without Optional, None and Annotated."""
    if typing.get_origin(tp) is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(tp) if a is not type(None) for t in _unwrap(a)]
    return [tp]


def _takes_str(tp: Any) -> bool:
    return any(t is str or t is Any for t in _unwrap(tp))


def string_slots(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[Slot]:
    slots: list[Slot] = []
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        for tp in _unwrap(field.annotation):
            origin, args = typing.get_origin(tp), typing.get_args(tp)
            if tp is str:
                slots.append(("str", path))
            elif isinstance(tp, type) and issubclass(tp, BaseModel):
                slots += string_slots(tp, path)
            elif origin is list and _takes_str(args[0]):
                slots.append(("item", path))
            elif origin is dict:
                slots += [("key", path)] if _takes_str(args[0]) else []
                slots += [("value", path)] if _takes_str(args[1]) else []
    return slots


SLOTS = string_slots(Recipe) + string_slots(ModelSpec, ("models", "m"))


def test_the_walk_finds_the_fields_under_test() -> None:
    found = {(k, ".".join(p)) for k, p in SLOTS}
    assert {
        ("str", "description"),
        ("str", "slurm.job_name"),
        ("item", "slurm.extra_sbatch"),
        ("key", "env"),
        ("value", "env"),
        ("key", "container.mounts"),
        ("value", "container.mounts"),
        ("str", "container.image"),
        ("value", "topology.decode.flags"),
        ("item", "topology.prefill.cpu_bind"),
        ("str", "models.m.hf_id"),
        ("value", "models.m.decode_env"),
        ("value", "connector.extra_config"),
    } <= found
    assert len(SLOTS) > 35


def _put(recipe: dict[str, Any], catalogue: dict[str, Any], slot: Slot, value: str, tag: str) -> None:
    """Write value into one slot; dict slots get their own key `tag` so slots never collide."""
    kind, path = slot
    if path[0] == "models":  # the catalogue entry of the recipe's model
        node, path = catalogue["models"][recipe["model"]], path[2:]
    else:
        node = recipe
    if path == ("model",):  # the recipe names its model: rename the catalogue entry too
        catalogue["models"][value] = catalogue["models"].pop(recipe["model"])
    for part in path[:-1]:
        node = node.setdefault(part, {})
    last = path[-1]
    if kind == "str":
        node[last] = value
        if slot[1][0] == "models" and last == "path":
            node.pop("hf_id", None)  # a model has exactly one source
    elif kind == "item":
        node[last] = [value]  # alone: a worker takes cpu_bind[index]
    elif kind == "key":
        node[last] = {**node.get(last, {}), value: "/v" if last == "mounts" else "v"}
    else:  # a mount's source must be an absolute path
        node[last] = {**node.get(last, {}), f"/{tag}" if last == "mounts" else tag: value}


def _base(runtime: str) -> tuple[dict[str, Any], dict[str, Any]]:
    recipe = copy.deepcopy(RECIPE)
    recipe["container"]["runtime"] = runtime
    recipe.setdefault("slurm", {})["gpu_request"] = "gres"
    recipe["topology"]["gpus_per_node"] = 1  # so that the GRES request is rendered
    return recipe, {"models": {"m": copy.deepcopy(MODEL)}}


def _write(root: Path, recipe: dict[str, Any], catalogue: dict[str, Any]) -> tuple[Path, Path]:
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    dump = lambda data: yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))  # noqa: E731
    (root / "recipes" / "hostile.yaml").write_text(dump(recipe))
    (root / "models.yaml").write_text(dump(catalogue))
    return root / "recipes" / "hostile.yaml", root / "models.yaml"


def _render(root: Path, recipe: dict[str, Any], catalogue: dict[str, Any], ctx: RenderContext) -> Path:
    recipe_file, models_file = _write(root, recipe, catalogue)
    out = Path(ctx.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    render_job(load_recipe(str(recipe_file), root=root, models_file=models_file), out, ctx)
    return out


# --- property: refused with the key named, or valid bash -----------------------------

PAYLOADS = [
    "$(touch @M@)",
    "`touch @M@`",
    "a b; touch @M@ #",
    "x\ntouch @M@\n",
    "' ; touch @M@ ; '",
    '" ; touch @M@ ; "',
    "'$(touch @M@)'",
    '"$(touch @M@)"',
    "\\'`touch @M@`",
    "}; touch @M@; {",
    "${IFS}$(touch @M@)",
    "'\"'\"'$(touch @M@)",
]
HOSTILE_CHARS = "$`'\"\\;|&<>(){}[]*?!#~=%,:@ \t\n\r\x00\x1b\x7f-_/.aZ09é\u2028"
hostile = st.one_of(
    st.sampled_from(PAYLOADS).map(lambda p: p.replace("@M@", "/tmp/pdbench-hostile-marker")),
    st.text(alphabet=HOSTILE_CHARS, max_size=24),
    st.text(max_size=12),
)
CTX_N = RenderContext(
    run_dir="/unused", root="/opt/pdbench", python="/opt/pdbench/.venv/bin/python", git_commit="0123abcd"
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slot=st.sampled_from(SLOTS),
    value=hostile,
    prefix=st.sampled_from(["", "--comment="]),
    runtime=st.sampled_from(RUNTIMES),
)
def test_hostile_string_is_refused_by_key_or_renders_valid_bash(
    slot: Slot, value: str, prefix: str, runtime: str
) -> None:
    recipe, catalogue = _base(runtime)
    _put(recipe, catalogue, slot, prefix + value, "H0")
    key = ".".join(slot[1])
    with tempfile.TemporaryDirectory() as d:
        ctx = dataclasses.replace(CTX_N, run_dir=f"{d}/run")
        try:
            out = _render(Path(d), recipe, catalogue, ctx)
        except ConfigError as e:
            # The error names the key, or for a cross-field rule the model holding it or the sibling
            # the rule asks for (a trace source given needs its duration set).
            parent = key.rpartition(".")[0]
            assert e.key and (e.key.startswith(key) or key.startswith(e.key) or e.key.startswith(parent + ".")), (
                e.key,
                key,
                str(e),
            )
            assert e.file.endswith(("hostile.yaml", "models.yaml")), str(e)
            return
        for script in ("job.slurm", "server.sh"):
            r = subprocess.run(["bash", "-n", str(out / script)], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, (key, value, r.stderr)


# --- sandbox: run the scripts against stubs ------------------------------------------

STUB = """#!{bash}
# A stand-in: records its argv (NUL-separated) and environment, and has no other effect.
log="$STUB_LOG/${{0##*/}}.$BASHPID.$RANDOM"
printf '%s\\0' "$@" > "$log.argv"
{env} -0 > "$log.env"
"""
SRUN_TAIL = """# Like srun on one node: run the task's command, past srun's own options.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
exec "$@"
"""


def _stubs(bin_dir: Path) -> None:
    bin_dir.mkdir()
    bash, env = shutil.which("bash"), shutil.which("env")
    for name in ("srun", "docker", "podman", "enroot", "apptainer", "vllm", "python", "pdbench", "sbatch"):
        text = STUB.format(bash=bash, env=env) + (SRUN_TAIL if name == "srun" else "")
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "id").write_text(f"#!{bash}\necho 1000\n")
    (bin_dir / "id").chmod(0o755)
    # Real tools the scripts (job.slurm, container.sh) use; `touch` too, so that an injected
    # `touch` would work.
    for tool in (
        "bash",
        "mkdir",
        "dirname",
        "touch",
        "mktemp",
        "rm",
        "ln",
        "mv",
        "date",
        "sleep",
        "timeout",
        "tail",
        "cut",
        "grep",
        "hostname",
    ):
        (bin_dir / tool).symlink_to(shutil.which(tool))


def _records(log: Path, prog: str) -> list[tuple[list[str], dict[str, str]]]:
    out = []
    for argv_file in sorted(log.glob(f"{prog}.*.argv")):
        argv = argv_file.read_bytes().split(b"\0")[:-1]
        env = dict(e.split(b"=", 1) for e in argv_file.with_suffix(".env").read_bytes().split(b"\0") if b"=" in e)
        out.append(([a.decode() for a in argv], {k.decode(): v.decode() for k, v in env.items()}))
    return out


def sbatch_args(script: str) -> list[str]:
    """The options sbatch reads from #SBATCH lines, as Slurm's reader splits them: words at
    unquoted blanks, ' and " quote, a backslash escapes (inside quotes too), '#' ends the line."""
    args: list[str] = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break  # sbatch stops at the first command
        if not line.startswith("#SBATCH"):
            continue
        word, have, quote, escape = "", False, "", False
        for ch in line[len("#SBATCH") :]:
            if escape:
                word, escape = word + ch, False
            elif ch == "\\":
                escape, have = True, True
            elif quote:
                if ch == quote:
                    quote = ""
                else:
                    word += ch
            elif ch in "'\"":
                quote, have = ch, True
            elif ch == "#":
                break
            elif ch.isspace():
                if have:
                    args.append(word)
                word, have = "", False
            else:
                word, have = word + ch, True
        if have:
            args.append(word)
    return args


def _arg_after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


Check = Callable[[dict[str, Any]], bool]


def _container_run(seen: dict[str, Any], runtime: str) -> list[str]:
    # The container that runs the node (not container.sh's import probe of the image).
    (argv,) = [a for a, _ in seen[runtime] if a[0] == "run" and a[-1].endswith("/server.sh")]
    return argv


def _check(slot: Slot, value: str, tag: str, runtime: str, procs: bool) -> Check | None:
    """How the stubs (or sbatch) must see `value` when the slot accepted it; None: nothing to see."""
    kind, path = slot
    key = ".".join(path)
    if key.startswith(("models.", "topology.", "connector.", "env")) and not procs:
        return None  # server.sh values: seen by the vllm stub
    vllm = lambda seen: [a for a, _ in seen["vllm"]]  # noqa: E731
    vllm_env = lambda seen: [e for _, e in seen["vllm"]]  # noqa: E731
    if key == "slurm.gres_name":  # the base recipe asks for GPUs as GRES
        return lambda seen: any(a.startswith(f"--gres={value}:") for a in seen["sbatch"])
    if key.startswith("slurm.") and kind == "str":
        flag = {"job_name": "job-name", "time_limit": "time"}.get(path[-1], path[-1])
        return lambda seen: f"--{flag}={value}" in seen["sbatch"]
    if key == "slurm.extra_sbatch":
        return lambda seen: value in seen["sbatch"]
    if kind == "value" and path[-1].endswith("env"):
        return lambda seen: any(e.get(tag) == value for e in vllm_env(seen))
    if kind == "value" and path[-1].endswith("flags"):
        return lambda seen: any(_arg_after(a, f"--{tag}") == value for a in vllm(seen))
    if key == "models.m.hf_id":
        return lambda seen: all(a[1] == value for a in vllm(seen))
    if key == "models.m.served_model_name":
        return lambda seen: all(_arg_after(a, "--served-model-name") == value for a in vllm(seen))
    if path[-1] == "cpu_bind":
        return lambda seen: any(e.get("VLLM_CPU_OMP_THREADS_BIND") == value for e in vllm_env(seen))
    if key == "connector.extra_config":

        def extra(seen: dict[str, Any]) -> bool:
            # (The aggregated baseline's servers have no KV connector.)
            lines = [a for a in vllm(seen) if "--kv-transfer-config" in a]
            got = [
                json.loads(_arg_after(a, "--kv-transfer-config") or "{}")["kv_connector_extra_config"] for a in lines
            ]
            return all((value in g) if kind == "key" else g.get(tag) == value for g in got)

        return extra
    if runtime == "none":
        return None
    if key == "container.image":
        return {
            "docker": lambda seen: value in _container_run(seen, "docker"),
            "podman": lambda seen: value in _container_run(seen, "podman"),
            "enroot": lambda seen: f"--container-image={value}" in seen["srun"][0][0],
            "apptainer": lambda seen: value in seen["apptainer"][0][0],
        }[runtime]
    if key == "container.mounts":
        entry = f"{value}:/v" if kind == "key" else f"/{tag}:{value}"
        if runtime in ("docker", "podman"):
            return lambda seen: entry in _container_run(seen, runtime)
        if runtime == "enroot":
            return lambda seen: any(
                a.startswith("--container-mounts=") and entry in a.split(",") for a in seen["srun"][0][0]
            )
        return lambda seen: entry in (_arg_after(seen["apptainer"][0][0], "--bind") or "").split(",")
    return None


def _run_sandbox(tmp: Path, runtime: str, payload: str) -> None:
    """One recipe with the payload in every slot that accepts it, each with its own marker.
    server.sh is the same for every runtime, so its processes run under runtime none only."""
    procs = runtime == "none"
    markers = tmp / "markers"
    markers.mkdir()
    recipe, catalogue = _base(runtime)
    checks: list[tuple[str, str, Check]] = []
    accepted = 0
    for i, slot in enumerate(SLOTS):
        if slot[1][-1] in ("name", "path"):
            continue  # the name is a safe file name by rule; a model path is the same argv word as hf_id
        value = payload.replace("@M@", str(markers / f"M{i}"))
        if slot[1] == ("slurm", "extra_sbatch"):
            value = "--comment=" + value
        r, c = copy.deepcopy(recipe), copy.deepcopy(catalogue)
        _put(r, c, slot, value, f"H{i}")
        try:
            Recipe.model_validate(r)
            Catalogue.model_validate(c)
        except ValidationError:
            continue  # refused at load; the property test checks that the error names the key
        recipe, catalogue, accepted = r, c, accepted + 1
        check = _check(slot, value, f"H{i}", runtime, procs)
        if check:
            checks.append((".".join(slot[1]) + f" ({slot[0]})", value, check))
    assert accepted, "every slot refused the payload"

    bin_dir, log = tmp / "bin", tmp / "log"
    _stubs(bin_dir)
    log.mkdir()
    ctx = RenderContext(
        run_dir=str(tmp / "run"), root=str(tmp / "root"), python=str(bin_dir / "python"), git_commit=None
    )
    out = _render(tmp / "project", recipe, catalogue, ctx)
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp),
        "STUB_LOG": str(log),
        "PDBENCH_PYTHON": str(bin_dir / "python"),
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "node0",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "PDBENCH_NODE_ADDR": "10.0.0.1",
        "PDBENCH_NODE_0_ADDR": "10.0.0.1",
        "PDBENCH_NODE_1_ADDR": "10.0.0.2",
    }
    runs = [["bash", str(out / "job.slurm")]]
    runs += [
        ["bash", str(out / "server.sh"), "proc", p["name"]]
        for p in json.loads((out / "plan.json").read_text())["processes"]
        if procs
    ]
    for argv in runs:
        r = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (argv, r.stdout, r.stderr)

    leaked = sorted(p.name for p in markers.iterdir())
    assert not leaked, f"{payload!r} ran as code from slots {[SLOTS[int(m[1:])] for m in leaked]}"
    seen: dict[str, Any] = {p: _records(log, p) for p in ("srun", "docker", "podman", "apptainer", "vllm")}
    seen["sbatch"] = sbatch_args((out / "job.slurm").read_text())
    # prefill, decode, and the two servers of the aggregated baseline
    assert len(seen["vllm"]) == (4 if procs else 0) and len(seen["srun"]) == 1
    broken = [(where, value) for where, value, check in checks if not check(seen)]
    assert not broken, f"values that did not reach their command intact: {broken}"


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_hostile_values_run_as_data_in_a_sandbox(runtime: str, payload: str, tmp_path: Path) -> None:
    _run_sandbox(tmp_path, runtime, payload)


def test_the_sandbox_catches_injection(tmp_path: Path) -> None:
    """The sandbox would see a leak: the stubs let a script run through, and `touch` works."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    _stubs(bin_dir)
    log.mkdir()
    script = tmp_path / "bad.sh"
    script.write_text(f'srun --nodes=1 bash -c "docker run x; touch {tmp_path}/M"\n')
    env = {"PATH": str(bin_dir), "STUB_LOG": str(log)}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    assert (tmp_path / "M").exists() and _records(log, "docker")[0][0] == ["run", "x"]


def test_sbatch_reader_matches_slurm_quoting() -> None:
    script = "#!/bin/bash\n#SBATCH --comment='a b #c' --x=\"y\"'z' # note\n#SBATCH --y=1\nx\n#SBATCH --z\n"
    assert sbatch_args(script) == ["--comment=a b #c", "--x=yz", "--y=1"]


def test_non_identifier_env_key_fails_the_cli_with_exit_2(tmp_path: Path) -> None:
    recipe, catalogue = _base("none")
    recipe["env"] = {"A=1; touch M; B": "v"}
    recipe_file, _ = _write(tmp_path, recipe, catalogue)
    r = subprocess.run(
        [sys.executable, "-m", "harness", "render", str(recipe_file), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "hostile.yaml: env.A=1; touch M; B.[key]: " in r.stderr and "environment variable name" in r.stderr
