"""Same-host pulls through CUDA IPC: the KV moves GPU to GPU, TCP carries only pull/ok/ack.

Prefill exports each distinct storage of its KV cache once, on the model thread at
start-up (`_share_cuda_` swaps the storage's DataPtr, which must not race kernel
launches). Decode asks once per connection (`ipc_hello`, after the job-secret
handshake) with its boot id; prefill answers only a decode of its own boot, with the
handle fields as hex in a JSON frame (nothing is unpickled). Decode opens them on its
own device: the same GPU, or prefill's GPU as a peer (the open enables peer access),
so the copy kernels run on decode's GPU and read prefill's blocks directly. Opened
handles are kept per prefill incarnation (`token`). Anything that does not fit (another
host, CPU caches, no peer access, an open that fails) leaves that peer on TCP.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
from dataclasses import dataclass
from typing import Any

import torch

from connector.layout import PagedKV

log = logging.getLogger(__name__)

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_OWN: set[str] = set()  # tokens exported by this process (CUDA cannot open those here)


class IpcError(Exception):
    pass


@functools.cache
def boot_id() -> str | None:
    """This kernel's boot id: equal on both sides only when they run on one host."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def _local_index(uuid: str) -> int | None:
    """This process's index of the GPU with `uuid` (CUDA_VISIBLE_DEVICES may renumber)."""
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    return None


# -- prefill side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Export:
    token: str  # this prefill incarnation: decode's opened handles are keyed by it
    info: dict[str, Any]  # what ipc_hello answers, JSON-able

    @classmethod
    def build(cls, kv: PagedKV) -> Export | None:
        """Share every storage of `kv` once; None (TCP only) where that is impossible."""
        if kv.device.type != "cuda" or boot_id() is None:
            return None
        try:
            return cls._build(kv)
        except Exception as exc:  # e.g. a pluggable allocator without IPC handles
            log.info("pdbench: CUDA IPC not offered (%s: %s); pulls use TCP", type(exc).__name__, exc)
            return None

    @classmethod
    def _build(cls, kv: PagedKV) -> Export:
        storages: list[dict[str, Any]] = []
        index: dict[int, int] = {}
        layers = []
        for t in kv.layers:
            st = t.untyped_storage()
            if st.data_ptr() not in index:
                index[st.data_ptr()] = len(storages)
                storages.append(_share(st))
            layers.append(
                {
                    "storage": index[st.data_ptr()],
                    "offset": t.storage_offset(),
                    "shape": list(t.shape),
                    "stride": list(t.stride()),
                }
            )
        token = secrets.token_hex(16)
        _OWN.add(token)
        info = {
            "boot_id": boot_id(),
            "token": token,
            "uuid": device_uuid(kv.device.index if kv.device.index is not None else torch.cuda.current_device()),
            "dtype": str(kv.dtype).removeprefix("torch."),
            "storages": storages,
            "layers": layers,
        }
        return cls(token, info)

    def hello(self, peer_boot_id: Any) -> dict[str, Any]:
        if peer_boot_id != self.info["boot_id"]:
            return {"ok": False, "error": "another host (boot id differs)"}
        return {"ok": True, **self.info}


def _share(st: torch.UntypedStorage) -> dict[str, Any]:
    _device, handle, size, offset, ref, ref_offset, event, event_sync = st._share_cuda_()
    return {
        "handle": bytes(handle).hex(),
        "size": int(size),
        "offset": int(offset),
        "ref": bytes(ref).hex(),
        "ref_offset": int(ref_offset),
        "event": bytes(event).hex() if event else "",
        "event_sync": bool(event_sync),
    }


# -- decode side ------------------------------------------------------------------------


@dataclass
class Remote:
    """Prefill's KV layers, opened on decode's device."""

    token: str
    layers: list[torch.Tensor]
    peer: bool  # prefill's GPU is another one (reads cross NVLink/PCIe)
    plan: Any = None  # how Stager.copy_from moves these layers into ours (connector/gather.py)


def open_remote(info: dict[str, Any], kv: PagedKV) -> Remote:
    """Open prefill's handles on decode's device; raises IpcError saying why not."""
    if kv.device.type != "cuda":
        raise IpcError("decode's KV cache is not on a GPU")
    if info.get("boot_id") != boot_id():
        raise IpcError("another host (boot id differs)")
    if info.get("token") in _OWN:
        raise IpcError("prefill is this process")
    if info.get("dtype") != str(kv.dtype).removeprefix("torch."):
        raise IpcError(f"dtype {info.get('dtype')} differs")
    here = kv.device.index if kv.device.index is not None else torch.cuda.current_device()
    there = _local_index(str(info.get("uuid")))
    if there is None:
        raise IpcError("prefill's GPU is not visible to this process")
    if there != here and not torch.cuda.can_device_access_peer(here, there):
        raise IpcError(f"no peer access from GPU {here} to GPU {there}")
    specs, raw = info.get("layers") or [], info.get("storages") or []
    if len(specs) != kv.num_layers:
        raise IpcError(f"{len(specs)} layers there, {kv.num_layers} here")
    storages = [_open(s, here) for s in raw]
    torch.cuda.current_stream(here).synchronize()  # the exporter's one-time IPC event
    layers = [_view(spec, storages, kv.layers[i], kv.dtype) for i, spec in enumerate(specs)]
    return Remote(str(info.get("token")), layers, there != here)


def _open(s: dict[str, Any], device: int) -> torch.UntypedStorage:
    try:
        return torch.UntypedStorage._new_shared_cuda(
            device,
            bytes.fromhex(s["handle"]),
            int(s["size"]),
            int(s["offset"]),
            bytes.fromhex(s["ref"]),
            int(s["ref_offset"]),
            bytes.fromhex(s["event"]),
            bool(s["event_sync"]),
        )
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise IpcError(f"cannot open a CUDA IPC handle: {exc}") from exc


def _view(spec: dict[str, Any], storages: list[torch.UntypedStorage], mine: torch.Tensor, dtype: Any) -> torch.Tensor:
    """Prefill's layer as a tensor over its opened storage, checked to stay inside it."""
    try:
        st = storages[int(spec["storage"])]
        offset, shape, stride = int(spec["offset"]), [int(x) for x in spec["shape"]], [int(x) for x in spec["stride"]]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise IpcError(f"bad layer spec: {exc}") from exc
    if shape[1:] != list(mine.shape[1:]) or len(stride) != len(shape):
        raise IpcError(f"layer shape {shape} does not match {list(mine.shape)}")
    esize = torch.empty(0, dtype=dtype).element_size()
    last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
    if offset < 0 or min(stride) < 0 or math.prod(shape) == 0 or (last + 1) * esize > st.nbytes():
        raise IpcError("layer outside its storage")
    return torch.empty(0, dtype=dtype, device=mine.device).set_(st, offset, shape, stride)
