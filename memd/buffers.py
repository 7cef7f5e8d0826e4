"""Shared buffers that memd owns and clients map without copying.

Two backends: POSIX shared memory files under /dev/shm (CPU; memd.segments keeps their life) and
cudaMalloc'd device memory exported as legacy CUDA IPC handles (GPU). memd writes only the int32
tables (target->draft mapping, req_to_token); it never touches KV bytes after zeroing them. On the GPU a
call's table writes are published by an inter-process event (`tables_written_event`) that clients'
streams wait on: memd's reply does not wait for the GPU, which modeld's steps keep busy.
"""

import abc

import numpy as np

from memd.segments import SHM_DIR, Segment
from protos import memd_pb2

# The card memd's pools live on: the first one CUDA_VISIBLE_DEVICES shows (it chooses the card, as for any CUDA
# process).
CUDA_DEVICE = 0

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4}


def contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return strides[::-1]


class SharedBuffers(abc.ABC):
    backend: str

    def __init__(self):
        self.descs: list[memd_pb2.BufferDesc] = []
        self.tables: dict[str, np.ndarray] = {}
        self.tables_written_event = b""  # cuda_ipc: the IPC handle clients wait on (Layout.tables_written_event)

    def create_kv(self, name: str, dtype: str, shape: list[int], rank: int = 0) -> None:
        """Tensor-parallel rank `rank`'s KV buffer of that name, zero-filled. memd keeps no view of it."""
        self._allocate(name, dtype, shape, rank)

    def create_table(self, name: str, shape: list[int]) -> np.ndarray:
        """An int32 table memd writes; returns the host array the allocator updates."""
        self.tables[name] = self._allocate(name, "int32", shape, 0)
        return self.tables[name]

    def _desc(self, name, dtype, shape, size, rank, **backend_fields) -> memd_pb2.BufferDesc:
        desc = memd_pb2.BufferDesc(
            name=name,
            rank=rank,
            backend=self.backend,
            dtype=dtype,
            shape=shape,
            strides=contiguous_strides(shape),
            offset_bytes=0,
            size_bytes=size,
            **backend_fields,
        )
        self.descs.append(desc)
        return desc

    @abc.abstractmethod
    def _allocate(self, name: str, dtype: str, shape: list[int], rank: int) -> np.ndarray | None: ...

    @abc.abstractmethod
    def write(self, name: str, flat_idx: np.ndarray, values: np.ndarray) -> None:
        """Make a host-side table write visible in the shared buffer."""

    def sync(self) -> None:
        """Publish the call's writes: visible to clients now (shm), or to client streams that wait on
        tables_written_event from now on (cuda_ipc)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every buffer; for shm, unlink the segments."""


class ShmBuffers(SharedBuffers):
    """Owner-only files in /dev/shm; the tables memd writes are the shared memory itself."""

    backend = "shm"

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix
        self.segments: list[Segment] = []  # the segments this memd created: the only ones it ever unlinks

    def _allocate(self, name, dtype, shape, rank):
        size = int(np.prod(shape)) * ELEMENT_BYTES[dtype]
        shm_name = f"{self.prefix}-{name}" + (f"_rank{rank}" if rank else "")
        segment = Segment.create(SHM_DIR / shm_name, size)
        self.segments.append(segment)
        # a table is one segment every rank maps: the host memory is the same for all
        self._desc(name, dtype, shape, size, rank, shm_name=shm_name, shared=dtype == "int32")
        if dtype == "int32":
            return np.memmap(segment.path, dtype=np.int32, mode="r+", shape=tuple(shape))
        return None

    def write(self, name, flat_idx, values):
        pass  # the host table is the shared segment

    def close(self):
        for table in self.tables.values():
            table._mmap.close()
        self.tables.clear()
        for segment in self.segments:
            segment.remove()
        self.segments.clear()


SCATTER_SOURCE = r"""
extern "C" __global__ void scatter_packed(const int* packed, const long long n, int* table) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) table[packed[i]] = packed[n + i];
}
"""


class CudaBuffers(SharedBuffers):
    """One cudaMalloc per buffer (legacy IPC shares whole allocations); host mirrors of tables."""

    backend = "cuda_ipc"

    def __init__(self, device_id: int):
        super().__init__()
        import cupy

        self.cupy = cupy
        self.device_id = device_id
        self.device = cupy.cuda.Device(device_id)
        props = cupy.cuda.runtime.getDeviceProperties(device_id)
        uuid = props.get("uuid", b"")
        self.uuid = uuid.hex() if isinstance(uuid, bytes) else str(uuid)
        self.memory: dict[str, object] = {}
        self.device_tables: dict[str, object] = {}
        self.dirty: dict[str, list[np.ndarray]] = {}
        # table[idx[i]] = values[i] for i < n, idx and values packed back to back: one launch per written table
        self.scatter = cupy.RawKernel(SCATTER_SOURCE, "scatter_packed")
        with self.device:  # recorded after every call's scatters; clients open it from its handle
            self.scatter.compile()  # at start, not in the first call's reply
            self.written = cupy.cuda.Event(block=False, disable_timing=True, interprocess=True)
            self.tables_written_event = bytes(cupy.cuda.runtime.ipcGetEventHandle(self.written.ptr))

    def _allocate(self, name, dtype, shape, rank):
        if rank:  # memd.plan refuses several ranks on CUDA: their pools would live on other devices
            raise ValueError(f"{name}: CUDA buffers of rank {rank} are not supported, only one device's")
        cupy = self.cupy
        if dtype == "int32" and np.prod(shape) >= 2**31:  # sync packs a table's flat indices as int32
            raise ValueError(f"table {name} of shape {shape} has 2**31 entries or more")
        size = int(np.prod(shape)) * ELEMENT_BYTES[dtype]
        with self.device:
            mem = cupy.cuda.Memory(max(size, 1))
            cupy.cuda.runtime.memset(mem.ptr, 0, max(size, 1))
            handle = cupy.cuda.runtime.ipcGetMemHandle(mem.ptr)
        self.memory[name] = mem
        self._desc(
            name, dtype, shape, size, rank, ipc_handle=bytes(handle), device_id=self.device_id, device_uuid=self.uuid
        )
        if dtype != "int32":
            return None
        self.device_tables[name] = cupy.ndarray(tuple(shape), cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
        return np.zeros(shape, np.int32)

    def write(self, name, flat_idx, values):
        self.dirty.setdefault(name, []).append(flat_idx)

    def sync(self):
        """One host->device copy per call (every dirty table's indices and values, packed as int32: tables hold
        fewer than 2**31 entries, _allocate checks), one scatter per table, then the event recorded behind them:
        a client stream that waits on it after the reply runs after the scatters (stream order on memd's side;
        the record precedes the client's wait in time). The host mirror holds the final value of every index, so
        an index written twice in one call (freed, then reused) ends right. memd's host never waits on the GPU;
        the copy from pageable memory returns once the bytes are staged."""
        cupy = self.cupy
        with self.device:
            if self.dirty:
                written = {name: np.unique(np.concatenate(parts)) for name, parts in self.dirty.items()}
                packed = cupy.asarray(
                    np.concatenate(
                        [
                            part
                            for name, idx in written.items()
                            for part in (idx.astype(np.int32), self.tables[name].reshape(-1)[idx])
                        ]
                    )
                )
                at = 0
                for name, idx in written.items():  # one launch a table; its indices are unique (np.unique)
                    n = len(idx)
                    self.scatter(((n + 255) // 256,), (256,), (packed[at:], np.int64(n), self.device_tables[name]))
                    at += 2 * n
                self.dirty.clear()
            self.written.record()

    def close(self):
        self.sync()
        with self.device:  # the last scatters finish before their memory is freed
            self.written.synchronize()
        self.device_tables.clear()
        self.memory.clear()  # cudaFree; importers' mappings keep nothing alive by contract
