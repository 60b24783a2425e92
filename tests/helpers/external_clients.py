"""What InferenceX's agentic aggregation reads of an aiperf run (process_agentic_result.py, read at 843c6254)."""

from __future__ import annotations

# What process_agentic_result.py reads, relative to the RESULT_DIR it is given (see above).
AGENTIC_READS = ("aiperf_artifacts/profile_export.jsonl", "aiperf_artifacts/profile_export_aiperf.json")

AGENTIC_RECORD_METRICS = ("time_to_first_token", "request_latency", "inter_token_latency", "output_sequence_length")
