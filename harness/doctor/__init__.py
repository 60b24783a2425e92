"""`pdbench doctor`: everything a job needs, checked before a real job queues for hours.

Two parts. Here, where pdbench submits: the recipe's `vllm serve` lines against vLLM's own
parser, the weights and the shared pdbench install when this host sees them. On the
nodes: a short job of the rendered recipe (Slurm, or the local launcher) that runs only
the preflight every real job runs before starting a server (container.sh: runtime, image,
pdbench importable in it; `pdbench node`: weights, GPUs, ports, RDMA, memory, disk,
clock) and stops. One line per problem, naming the node and the cause.

findings.py holds what was found and how to read it; check_job.py is the pipeline, the submit
pipeline's check and render stages (harness.submit) with a short check job as its launch.
"""
