"""Zero-copy torch views of memd's shared buffers: /dev/shm segments, or CUDA IPC allocations opened with CuPy and
handed to torch through DLPack; and, on the GPU, memd's tables-written event opened as a torch event."""

import torch

from memd.segments import open_segment
from protos import memd_pb2

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int32": torch.int32}


def map_buffer(desc: memd_pb2.BufferDesc) -> torch.Tensor:
    """A zero-copy torch view of one shared buffer described by memd; SegmentError for a missing or short segment."""
    dtype = TORCH_DTYPES[desc.dtype]
    element = torch.empty((), dtype=dtype).element_size()
    if desc.backend == "shm":  # the segment must exist at its full size: a client never creates one
        flat = torch.frombuffer(open_segment(desc.shm_name, desc.size_bytes), dtype=dtype)
    elif desc.backend == "cuda_ipc":
        flat = _map_cuda(desc).view(dtype)
    else:
        raise ValueError(f"unknown buffer backend {desc.backend!r}")
    return flat.as_strided(tuple(desc.shape), tuple(desc.strides), desc.offset_bytes // element)


def _cuda_device_for(desc: memd_pb2.BufferDesc) -> int:
    """Match by UUID: device ordinals differ between processes with different CUDA_VISIBLE_DEVICES."""
    import cupy

    for index in range(cupy.cuda.runtime.getDeviceCount()):
        uuid = cupy.cuda.runtime.getDeviceProperties(index).get("uuid", b"")
        if desc.device_uuid and (uuid.hex() if isinstance(uuid, bytes) else str(uuid)) == desc.device_uuid:
            return index
    return desc.device_id


def _map_cuda(desc: memd_pb2.BufferDesc) -> torch.Tensor:
    import cupy

    device = _cuda_device_for(desc)
    with cupy.cuda.Device(device):
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(desc.ipc_handle)
        memory = cupy.cuda.UnownedMemory(ptr, desc.size_bytes, None, device)
        raw = cupy.ndarray((desc.size_bytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
    return torch.from_dlpack(raw)


def open_tables_written(layout: memd_pb2.Layout) -> torch.cuda.Event | None:
    """memd's tables-written event (cuda_ipc), for client streams to wait on before reading a table; None for shm."""
    if not layout.tables_written_event:
        return None
    desc = next(d for d in layout.buffers if d.backend == "cuda_ipc")
    return torch.cuda.Event.from_ipc_handle(_cuda_device_for(desc), layout.tables_written_event)
