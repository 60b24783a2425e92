"""Floor 1 of the house: the run directory, its file names and the records two stages share.

RunDir owns every path (paths.py), ResultName every result file name (result_name.py);
status.py holds the failure records and status.json; proxy_timings.py the proxy's per-request
timings, written by the proxy and read by the benchmark client. Imports nothing above floor 1.
"""

from harness.rundir.paths import LockUnreadable, RunDir, RunNotFound
from harness.rundir.result_name import ResultName
from harness.rundir.status import TIME_LIMIT_WARNING, Failure, FailureRecords, log_detail, read_status, write_status

__all__ = [
    "TIME_LIMIT_WARNING",
    "Failure",
    "FailureRecords",
    "LockUnreadable",
    "ResultName",
    "RunDir",
    "RunNotFound",
    "log_detail",
    "read_status",
    "write_status",
]
