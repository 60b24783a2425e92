"""What each file of a run directory is, who writes it and who reads it: the source of
results/README.md (`python -m harness.rundir.file_table > results/README.md`; a test keeps the
committed page equal to this)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.rundir import paths as p
from harness.rundir.result_name import ResultName


@dataclass(frozen=True)
class Entry:
    name: str  # relative to the run directory; <...> marks a part that varies
    what: str
    written_by: str
    read_by: str


LAYOUT: tuple[Entry, ...] = (
    Entry(p.JOB_SCRIPT, "the Slurm batch script, every #SBATCH option inside", "render", "sbatch, the local launcher"),
    Entry(p.SERVER_SCRIPT, "the node script: the exact command of every process", "render", "each node (srun, local)"),
    Entry(p.CONTAINER_SCRIPT, "docker/podman: what each node runs on its host to run server.sh", "render", "job.slurm"),
    Entry(
        p.LOCK,
        "the resolved recipe and model, where each value came from, fingerprint, version",
        "render",
        "submit --resume, humans",
    ),
    Entry(
        p.PLAN,
        "the topology as data: workers, nodes, ports, timeouts",
        "render",
        "pdbench node, doctor, status/logs, report",
    ),
    Entry(
        p.bench_config_name("disagg"),
        "the benchmark client's configuration (bench-<phase>.json for an aggregated baseline)",
        "render",
        "pdbench bench",
    ),
    Entry(
        p.NOT_SUBMITTED,
        "a run that submit rendered and never submitted (--dry-run, sbatch failed, nothing left to resume): "
        "why; such a run is never a recipe's latest",
        "submit",
        "status, logs, cancel, RunDir.resolve",
    ),
    Entry(p.DOCTOR_MARKER, "present in a `pdbench doctor` run: the job checks and stops", "doctor", "pdbench node"),
    Entry(
        p.LAUNCH,
        "which launcher ran the job and its identity (Slurm job id, or the local launcher's PID and "
        "its nodes' process groups, each with its start time)",
        "launch",
        "status, logs, cancel, --wait",
    ),
    Entry(
        ResultName.TEMPLATE,
        "one result per sweep point (`_gpus_<N>` for one aggregated server)",
        "pdbench bench",
        "report, collect, status, submit --resume, node 0's validity check",
    ),
    Entry(
        p.SLO_SEARCH,
        "an SLO search over the concurrency ladder (benchmark.slo_search): every step, why it ran and its "
        "verdict per SLO, the best and first failing concurrency per SLO, the repeats; done once it ended",
        "pdbench bench",
        "pdbench search, report, humans",
    ),
    Entry(
        p.REPEATS + "/<k>/",
        "an SLO search's repeat k of the best points: their results, metrics/ and sentinels/ as at the top",
        "pdbench bench",
        "pdbench search, humans (report counts the top-level points only)",
    ),
    Entry(
        p.workload_bench_config_name("<name>"),
        "a workload's client configuration (benchmark.workloads): the job's settings with the workload's merged in",
        "render",
        "the workload's pdbench bench, status",
    ),
    Entry(
        p.workload_subdir("<name>") + "/",
        "a workload's sweep after the job's own (benchmark.workloads), in recipe order over the same servers: its "
        "results (metadata.workload), metrics/ before/after, sentinels/, power/points/, as at the top; another "
        "client's clients/<client>/conc_<C>/ and logs/<client>-conc_<C>.log (its client or cross_check)",
        "pdbench bench, node 0",
        "report and collect (a run of its own, labelled <run>/workloads/<name>), status, node 0's validity check",
    ),
    Entry(
        p.SUPERSEDED + "/", "earlier, incomplete results of points a resumed sweep ran again", "pdbench bench", "humans"
    ),
    Entry(
        p.STATUS,
        "succeeded | failed | timeout, the first cause, the result files",
        "node 0 (or the local launcher)",
        "status, report, doctor, --wait",
    ),
    Entry(
        p.METRICS + "/",
        "each server's /metrics before and after the sweep, and per point (concurrency_<C>[_<shape>]/)",
        "pdbench node, pdbench bench",
        "validity, submit --resume",
    ),
    Entry(
        p.PROXY_TIMINGS + "/",
        "per-request timings: the proxy's (proxy-timings-<pid>.jsonl) and the bundled connector's decode "
        "loads (connector-timings-<pid>.jsonl, connector/README.md), joined by the client's X-Pdbench-Id",
        "pdbench proxy, decode's bundled connector",
        "pdbench bench (TTFT breakdown)",
    ),
    Entry(
        p.SENTINELS + "/",
        "greedy sentinel prompts of every point: reference.json (answered whole by one instance before "
        "the sweep), <point tag>.json (their answers through the deployment, compared token by token); "
        "sentinels/<phase>/ for an aggregated baseline",
        "pdbench bench",
        "validity (outputs_match), report, humans",
    ),
    Entry(
        p.EVALS + "/<phase>-<when>/",
        "an accuracy eval (lm-eval) against the phase's proxy: lm-eval's results and meta_env.json, "
        f"as InferenceX's collect_eval_results.py reads them; {p.ACCURACY_SUMMARY}: score, threshold, verdict",
        "pdbench node (node 0)",
        "status, report, InferenceX's collect_eval_results.py",
    ),
    Entry(
        p.client_point_subdir("<client>", "<C>") + "/",
        f"another client's run of one point (benchmark.client or cross_check: aiperf, vllm): "
        f"{p.CLIENT_COMMAND} (its command line), {p.CLIENT_RUN} (exit code, wall and CPU seconds); "
        f"aiperf: {p.AIPERF_ARTIFACTS}/ (profile_export.jsonl, profile_export_aiperf.json, "
        f"server_metrics_export.json), as InferenceX's process_agentic_result.py "
        f"reads them; vllm: {p.VLLM_BENCH_RESULT}; clients/aggregated/ for an aggregated baseline",
        "pdbench bench",
        "report (cross-check), InferenceX's process_agentic_result.py, humans",
    ),
    Entry(
        p.POWER_RAW + "/node<N>.csv, node<N>.json",
        "each node's GPU power samples (time, host, GPU index and UUID, W, the GPU's energy counter where it "
        "has one) through each phase, and what its sampler read them with, or why it had nothing (missing)",
        "pdbench node (its power sampler)",
        "node 0's power accounting, InferenceX's aggregate_power.py (--csv, one node)",
    ),
    Entry(
        p.POWER_POINTS + "/" + ResultName.TEMPLATE,
        "each point's GPU energy per role and server over its measured window (J, mean and peak W, J per "
        "input token on prefill, per output token on decode, per request), power_valid and why not, and "
        "its cost at the cluster's prices ($ per million input and output tokens)",
        "pdbench node (node 0)",
        "report, humans",
    ),
    Entry(
        p.power_package_subdir("<phase>") + "/",
        "the phase's samples and measured windows as the dcgm-power v1 package (manifest.json, samples.csv, "
        "windows/<result>.json) that InferenceX's aggregate_power_multinode.py reads (it refuses pdbench's "
        "producer; docs/power.md)",
        "pdbench node (node 0)",
        "InferenceX's aggregate_power_multinode.py, humans",
    ),
    Entry(
        p.LOGS + "/",
        "node<N>.log, <server>.log, proxy.log, bench.log, <client>-conc_<C>.log (another client's output), "
        "container-node<N>.log, setup-node<N>.log, node<N>.out (local launcher)",
        "pdbench node, supervisor, container.sh",
        "logs, follow, failure records",
    ),
    Entry(p.NODES + "/<N>.json", "each node's address (rendezvous)", "pdbench node", "the other nodes"),
    Entry(
        p.STATE + "/root_cause, abort",
        "the job's first cause and first failure, each written once",
        "nodes, the local launcher, the scripts' `fail`",
        "every node (stop), status",
    ),
    Entry(
        p.STATE + "/done[-<phase>], exit-node<N>.json",
        "node 0 finished (a phase); a node tore down",
        "pdbench node",
        "the other nodes",
    ),
    Entry(
        p.STATE + "/procs-node<N>.json",
        "every process a node started: PID and start time",
        "supervisor",
        "the local launcher (leftovers), cancel, the node's reaper, a restarted node",
    ),
    Entry(p.STATE + "/preflight-node<N>.json", "a node's preflight findings", "pdbench node", "doctor"),
    Entry(
        p.STATE + "/runtime-<server>.json",
        "what each server runs: interpreter, torch, connector library, pdbench",
        "pdbench node",
        "pdbench bench (result metadata)",
    ),
    Entry(
        p.STATE + "/" + p.KV_CEILING,
        "the same-job KV ceiling: a copy between prefill-0's and decode-0's devices before the sweep "
        "(method, devices, bytes, each copy's time), or why it is missing",
        "pdbench node (node 0)",
        "pdbench bench (validity rule kv_transport)",
    ),
    Entry(
        p.STATE + "/" + p.IMAGE_RECORD_GLOB,
        "the image each node (or the job) ran and its digest",
        "job.slurm, container.sh",
        "pdbench bench (result metadata)",
    ),
    Entry(
        p.STATE + "/heartbeat-node<N>, slurm-job-node<N>",
        "in containers: the host task lives; the Slurm job the node's container belongs to",
        "container.sh",
        "pdbench node (inside the container), container.sh",
    ),
    Entry(
        p.PERF_PROFILE,
        "per-role performance profile fitted from the run's points: prefill time vs prompt tokens, "
        "decode step time vs batch, KV hand-off and proxy time, each fit with its error and input range",
        "pdbench predict, pdbench report --predict",
        "pdbench predict (--from)",
    ),
    Entry(
        p.PRIOR_PREDICTION,
        "what was predicted for each point before the run ran (TTFT p90, TPOT, goodput per device, "
        "its band and extrapolation), from another run's profile",
        "pdbench submit (--predict-from, or a comparable earlier run), pdbench search (a candidate it predicted)",
        "pdbench bench (each result's metadata.prediction), pdbench report (predicted before it ran)",
    ),
    Entry(p.SECRET, "the job's KV secret (mode 0600)", "pdbench node", "the bundled connector in vLLM"),
    Entry(
        "slurm_job_id",
        "a run made before launch.json: its Slurm job id",
        "earlier pdbench versions",
        "status, logs, cancel",
    ),
    Entry(p.SLURM_OUTPUT.replace("%j", "<jobid>"), "Slurm's output", "Slurm", "humans"),
)


def markdown() -> str:
    rows = [f"| `{e.name}` | {e.what} | {e.written_by} | {e.read_by} |" for e in LAYOUT]
    return (
        "# results/\n\n"
        "Default home of run directories; everything here but this file is ignored by git. One run is\n"
        "`results/<recipe>/<UTC timestamp>-<short id>/`, never reused or overwritten. Generated from\n"
        "harness/rundir/file_table.py (`python -m harness.rundir.file_table > results/README.md`);\n"
        "harness.rundir.RunDir owns every name below.\n\n"
        "| file | what | written by | read by |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    print(markdown(), end="")
