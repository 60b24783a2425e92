"""Other clients in the same job: aiperf and `vllm bench serve`, run by `pdbench bench` against
the same proxy, under the job's supervision (the node runs `pdbench bench`; each client run is a
bounded child of it), their artifacts kept under the run directory (RunDir.client_point)."""

from harness.bench.external.point_processes import ExternalOutcome, run_external_clients

__all__ = ["ExternalOutcome", "run_external_clients"]
