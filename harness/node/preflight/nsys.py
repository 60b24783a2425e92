"""nsys on a node whose servers run under it (benchmark.profile.tool: nsys): on PATH, and able to
turn its captures into .nsys-rep reports.

An nsys whose QdstrmImporter is missing or does not run (the one inside Nsight Compute on the
H200: not where nsys looks, and, linked there, short of libdw.so.1) captures, then
leaves each capture as a raw .qdstrm stream in its temporary directory: on an H200 with vLLM,
about 2 GB per profiled window, about 2 minutes to write, during which /stop_profile does not
answer, and the streams reach the -o directory only when the server exits. No report would come
back from the job. A two-second capture of `true` shows which kind of nsys this is: the one that
converts writes probe.nsys-rep, the other probe.qdstrm ("skipping importation of the QDSTRM file").
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from harness.node.preflight.tool import ToolFailed, run_tool

FULL_INSTALL = (
    "install Nsight Systems itself in the image (its nsys converts captures), or use benchmark.profile.tool: torch"
)


def check_nsys(env: Mapping[str, str] | None = None, timeout_s: float = 15) -> list[str]:
    """nsys is on PATH and a capture of `true` with it leaves a .nsys-rep (not a raw .qdstrm)."""
    env = os.environ if env is None else env
    nsys = shutil.which("nsys", path=env.get("PATH", os.defpath))
    if nsys is None:
        return [
            f"nsys is not on PATH, and benchmark.profile.tool: nsys runs this node's servers under it: {FULL_INSTALL}"
        ]
    with tempfile.TemporaryDirectory(prefix="pdbench-nsys-probe-") as tmp:
        out = Path(tmp) / "probe"
        # nsys's own temporary files go to TMPDIR: here, so that the probe leaves nothing behind.
        argv = [nsys, "profile", "-t", "none", "--force-overwrite", "true", "-o", str(out), "true"]
        try:
            run_tool(argv, timeout_s, {**env, "TMPDIR": tmp}, timeout_s)
        except ToolFailed as e:
            return [f"nsys ({nsys}) could not capture a trivial program: {e}"]
        made = sorted(p.name for p in Path(tmp).iterdir())
    if "probe.nsys-rep" in made:
        return []
    if "probe.qdstrm" in made:
        return [
            f"nsys ({nsys}) cannot convert its captures (its QdstrmImporter is not where it looks, or does "
            "not run: nsys then says 'skipping importation of the QDSTRM file'): every profiled "
            f"window would leave a raw .qdstrm of about 2 GB and no report; {FULL_INSTALL}"
        ]
    return [
        f"nsys ({nsys}) wrote no report for a trivial program (found: {', '.join(made) or 'nothing'}): {FULL_INSTALL}"
    ]
