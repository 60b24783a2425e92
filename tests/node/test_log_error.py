"""harness.node.log_error: the first cause a process's log names, ahead of its echoes."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.node.log_error import first_error

ENGINE_DIED = """\
(APIServer pid=5131) WARNING 12-01 04:28:09 [system_utils.py:294] Found ulimit of 20000 and failed \
to automatically increase with error current limit exceeds maximum limit. This can cause fd limit \
errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(EngineCore pid=5273) INFO 12-01 04:28:48 [gpu_worker.py:361] Initial free memory 139.29 GiB
(EngineCore pid=5273) ERROR 12-01 04:29:00 [worker.py:1747] Potentially invalid KV blocks for unrecognized request
terminate called after throwing an instance of 'c10::AcceleratorError'
  what():  CUDA error: unspecified launch failure
Search for `cudaErrorLaunchFailure' in https://docs.nvidia.com/cuda/cuda-runtime-api for more information.
(APIServer pid=5131) ERROR 12-01 04:31:41 [async_llm.py:699] Traceback (most recent call last):
(APIServer pid=5131) ERROR 12-01 04:31:41 [async_llm.py:699]     raise self._format_exception(outputs) from None
(APIServer pid=5131) ERROR 12-01 04:31:41 [async_llm.py:699] vllm.v1.engine.exceptions.EngineDeadError: \
EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=5131) INFO:     127.0.0.1:51032 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
"""


# NIXL 1P1D's prefill on one H200 (vLLM 0.20.0, FP8 KV cache, 8k prompts at c=32): FlashMLA's
# metadata kernel's check failed, then the CUDA error it caused.
FLASHMLA_ASSERT = """\
(APIServer pid=2106) INFO:     127.0.0.1:51162 - "GET /metrics HTTP/1.1" 200 OK
Assertion failed (/workspace/.deps/flashmla-src/csrc/extension/sm90/dense_fp8/flash_fwd_mla_metadata.cu:64): \
now_idx == batch_size && now_block == 0 && now_n_split_idx == 0
(APIServer pid=2106) INFO:     127.0.0.1:39608 - "GET /health HTTP/1.1" 200 OK
terminate called after throwing an instance of 'c10::AcceleratorError'
  what():  CUDA error: unspecified launch failure
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


@pytest.mark.parametrize(
    ("log", "want"),
    [
        (ENGINE_DIED, "CUDA error: unspecified launch failure"),
        (
            FLASHMLA_ASSERT,
            "Assertion failed (/workspace/.deps/flashmla-src/csrc/extension/sm90/dense_fp8/flash_fwd_mla_metadata.cu:64): "
            "now_idx == batch_size && now_block == 0 && now_n_split_idx == 0",
        ),
        (
            "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [5,0,0], thread: [63,0,0] "
            'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
            "RuntimeError: CUDA error: device-side assert triggered\n",
            "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [5,0,0], thread: [63,0,0] "
            'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.',
        ),
        (
            "(EngineCore_DP0 pid=7) ERROR 12-01 01:00:00 [core.py:9] torch.OutOfMemoryError: CUDA out of memory. "
            "Tried to allocate 2.00 GiB\n(EngineCore_DP0 pid=7) ERROR 12-01 01:00:00 [core.py:9] RuntimeError: later\n",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (
            'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            "    raise ValueError('--max-model-len exceeds the model')\nValueError: --max-model-len exceeds the model\n",
            "ValueError: --max-model-len exceeds the model",
        ),
        (
            "misc NCCL WARN x\nRuntimeError: NCCL error in: nccl.cpp:1, unhandled cuda error\n",
            "RuntimeError: NCCL error in: nccl.cpp:1, unhandled cuda error",
        ),
        # The echo alone: named when nothing above it is.
        (
            ENGINE_DIED.replace("what():  CUDA error: unspecified launch failure\n", ""),
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ),
    ],
)
def test_the_first_cause_is_named_over_its_echoes_and_warnings(tmp_path: Path, log: str, want: str) -> None:
    path = tmp_path / "server.log"
    path.write_text(log)
    assert first_error(path) == want


def test_a_healthy_log_names_nothing_even_when_it_quotes_error_words(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text(ENGINE_DIED.split("terminate called")[0] + "INFO: GET /metrics 200 OK\n")
    assert "OSError: [Errno 24]" in path.read_text()  # precondition: the warning quotes an error
    assert first_error(path) is None
    assert first_error(tmp_path / "missing.log") is None


def test_only_the_logs_end_is_read(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("ValueError: long ago\n" + "INFO: filler line\n" * 1000 + "KeyError: 'recent'\n")
    assert first_error(path) == "ValueError: long ago"
    assert first_error(path, scan_bytes=4096) == "KeyError: 'recent'"
