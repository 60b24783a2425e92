"""The connector's vLLM version gate, and its load on the installed vLLM (0.32 here).

The load on vLLM 0.20 runs on a GPU machine only (docs/gpu.md); here, the gate's range,
its message, and the loading path vLLM uses (``getattr(import_module("connector"),
"PdbenchConnector")``) stopping before any vLLM internals on a version outside the range.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import require_vllm

from connector.vllm_compat import UnsupportedVllmError, check_version, parse_version, supported_range

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.20.0", (0, 20)), ("0.32.0+cpu", (0, 32)), ("0.21.1rc2.dev5+g1234", (0, 21)), ("1.0", (1, 0))],
)
def test_parse_version_reads_major_minor(version: str, expected: tuple[int, int]) -> None:
    assert parse_version(version) == expected


@pytest.mark.parametrize("version", ["0.20.0", "0.20.2", "0.26.1", "0.32.0", "0.32.0+cpu", "0.32.3"])
def test_supported_versions_pass(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["0.19.1", "0.11.0", "0.33.0", "0.33.0rc1", "1.0.0", "dev"])
def test_unsupported_version_names_itself_and_the_range(version: str) -> None:
    with pytest.raises(UnsupportedVllmError) as e:
        check_version(version)
    assert repr(version) in str(e.value) or f"vLLM {version}." in str(e.value)
    if version != "dev":
        assert supported_range() in str(e.value)


def test_connector_loads_on_installed_vllm() -> None:
    require_vllm()
    import connector
    from connector.vllm_compat import TransferResults, installed_version

    check_version(installed_version())  # precondition: the installed vLLM is in range
    cls = connector.PdbenchConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    assert issubclass(cls, KVConnectorBase_V1)
    r = TransferResults(finished_recving={"a"}, failed_recving={"a"})
    assert (r.finished_sending, r.finished_recving, r.failed_recving) == (set(), {"a"}, {"a"})


def test_unsupported_vllm_fails_at_load_naming_its_version(tmp_path: Path) -> None:
    # A stand-in `vllm` package that reports 0.19.0 and has nothing else: the gate must stop
    # the load before anything imports vLLM's internals (which would fail less clearly).
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "0.19.0"\n')
    code = textwrap.dedent("""
        import importlib
        getattr(importlib.import_module("connector"), "PdbenchConnector")
    """)
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert "UnsupportedVllmError" in p.stderr
    assert "this is vLLM 0.19.0" in p.stderr
    assert supported_range() in p.stderr


def test_vllm_020_cuda_layout_is_addressed_by_block() -> None:
    # vLLM 0.20's CUDA attention caches are [2, B, N, H, C] (K and V planes first): the
    # connector must address blocks on dim 1 there, or a pull reads the wrong bytes.
    import torch

    from connector.layout import PagedKV, blocks_first

    blocks, n, h, c = 6, 4, 2, 8
    k_v = torch.arange(2 * blocks * n * h * c, dtype=torch.float32).reshape(2, blocks, n, h, c)
    kv = PagedKV({"l0": k_v, "l1": k_v.clone()}, num_blocks=blocks, block_size=n)
    assert (kv.ratio, kv.kernel_block_size, kv.heads, kv.num_layers) == (1, n, h, 2)
    assert kv.block_bytes == [2 * n * h * c * 4] * 2
    view = kv.layers[0]
    assert view.shape == (blocks, h, 2, n, c) and view.data_ptr() == k_v.data_ptr()  # no copy
    # Block 3 of the view is exactly block 3's K and V, and moving it moves nothing else.
    assert torch.equal(view[3, :, 0], k_v[0, 3].permute(1, 0, 2))
    assert torch.equal(view[3, :, 1], k_v[1, 3].permute(1, 0, 2))
    dst = torch.zeros_like(k_v)
    dview = blocks_first(dst, blocks)
    dview.index_copy_(0, torch.tensor([1]), view.index_select(0, torch.tensor([3])))
    assert torch.equal(dst[:, 1], k_v[:, 3])
    assert dst[:, [0, 2, 3, 4, 5]].abs().sum() == 0
    # A block-first cache (vLLM 0.32's [B, H, N, C]) is left as it is.
    flat = torch.zeros(blocks, h, n, c)
    assert blocks_first(flat, blocks) is flat
