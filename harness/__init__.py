"""pdbench: benchmark prefill/decode disaggregated vLLM serving on Slurm and on one machine."""

__version__ = "0.1.0"
