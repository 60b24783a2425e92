"""One process or several for a server's engine: the model catalogue's `uni` executor against a
server with more than one rank.

models.yaml's CPU models run `distributed-executor-backend: uni` with
VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core holds its one worker, where vLLM's `mp`
executor would start a process per rank that imports torch and vLLM again (seconds of a small
machine's start). On the CPU platform that variable does nothing else for `vllm serve` (whose
engine core is always a process of its own): vllm/platforms/cpu.py turns `uni` into `mp` unless
it is "0". Neither setting can serve more than one rank:
- tensor x pipeline parallel > 1: UniProcExecutor builds rank 0 alone, whose distributed init
  waits for ranks nobody starts; the server never answers its health check.
- data parallel > 1: each DP rank's engine core runs its worker in-process, and only the `mp`
  executor (vllm/utils/ompmultiprocessing.py) binds a worker to its rank's group of
  VLLM_CPU_OMP_THREADS_BIND; under `uni` every rank's threads run on every core of the server.
So such a server renders `mp` and goes without the catalogue's VLLM_ENABLE_V1_MULTIPROCESSING=0
(render/commands.py); a recipe that asks for `uni` there itself is refused (check_executor).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness.config.load import ConfigError, ResolvedRecipe
from harness.config.schema import Flags, FlagValue

BACKEND_FLAG = "distributed-executor-backend"
ONE_PROCESS = "uni"
WORKER_PROCESSES = "mp"
# vLLM's CPU platform keeps `uni` only with this "0"; with `mp` it has no use.
ONE_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def catalogue_flags(rr: ResolvedRecipe, role: str) -> Flags:
    """The model's `vllm serve` flags for one role, as models.yaml has them (aggregated servers
    default to decode's)."""
    m = rr.model
    if role == "prefill":
        return m.prefill_flags
    return m.aggregated_flags if role == "aggregated" and m.aggregated_flags is not None else m.decode_flags


def flag_value(flags: Flags, name: str) -> FlagValue | None:
    """A flag's value, spelt with '-' or '_' as vLLM's parser takes both (the last one wins)."""
    found = [value for key, value in flags.items() if key.replace("_", "-") == name]
    return found[-1] if found else None


def engine_ranks(rr: ResolvedRecipe, role: str) -> int:
    """Worker ranks of one engine of a role's server: tensor x pipeline parallel."""
    spec = getattr(rr.recipe.topology, role)
    pp = flag_value({**catalogue_flags(rr, role), **spec.flags}, "pipeline-parallel-size")
    return spec.tp * int(str(pp)) if pp is not None and str(pp).isdigit() else spec.tp


def replaces_uni(flags: Flags, ranks: int, dp: int = 1) -> bool:
    """Whether a server whose model flags ask for the one-process `uni` executor runs `mp` instead
    (without VLLM_ENABLE_V1_MULTIPROCESSING): more than one rank per engine (tp x pp), or more than
    one data-parallel rank (the module's docstring says why)."""
    return flag_value(flags, BACKEND_FLAG) == ONE_PROCESS and (ranks > 1 or dp > 1)


def as_run(flags: Flags, env: Mapping[str, str], replaced: bool) -> tuple[Flags, dict[str, str]]:
    """The model's flags and environment as the server runs them: with `mp` and without the
    one-process variable where its `uni` is replaced (replaces_uni)."""
    if not replaced:
        return dict(flags), dict(env)
    mp = {k: WORKER_PROCESSES if k.replace("_", "-") == BACKEND_FLAG else v for k, v in flags.items()}
    return mp, {k: v for k, v in env.items() if k != ONE_PROCESS_ENV}


def replaces_catalogue_uni(rr: ResolvedRecipe, role: str) -> bool:
    """replaces_uni for a role's servers, from the catalogue's flags and the role's sizes."""
    return replaces_uni(catalogue_flags(rr, role), engine_ranks(rr, role), getattr(rr.recipe.topology, role).dp)


def check_executor(rr: ResolvedRecipe, roles: Iterable[str]) -> None:
    """Refuse a recipe whose role flags ask for `uni` on servers with more than one rank: the
    server could not start (its health gate would time out)."""
    for role in roles:
        spec = getattr(rr.recipe.topology, role)
        keys = [k for k in spec.flags if k.replace("_", "-") == BACKEND_FLAG]
        if not replaces_uni(spec.flags, engine_ranks(rr, role), spec.dp):
            continue  # the role's own flags do not ask for `uni` where it cannot run
        key = f"topology.{role}.flags.{keys[-1]}"
        ranks = engine_ranks(rr, role)
        sizes = [f"{ranks} ranks per engine (tp x pp)"] if ranks > 1 else []
        sizes += [f"{spec.dp} data-parallel ranks (dp)"] if spec.dp > 1 else []
        raise ConfigError(
            rr.blame(key),
            key,
            f"'{ONE_PROCESS}' runs a server's engine in one process, but each {role} server has "
            f"{' and '.join(sizes)}: vLLM needs '{WORKER_PROCESSES}' (a process per rank) there; set "
            f"'{WORKER_PROCESSES}' or leave the flag out (a model's '{ONE_PROCESS}' then renders as "
            f"'{WORKER_PROCESSES}')",
        )
