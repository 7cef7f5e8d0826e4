"""Kernel tests: every Triton kernel against its torch reference, on CPU through Triton's interpreter, on CUDA compiled.

TRITON_INTERPRET must be set before a kernel is *defined* (triton.jit reads it when modeld.kernels.* is imported), so it
is set here at import time: pytest imports this conftest before any test module of this folder. It is set only when
there is no GPU (and an explicit setting is respected): on a GPU machine the CUDA cases must run compiled kernels.
The setting is process-wide, but it can only change how Triton kernels run, and without a GPU they can run no other
way, so other test folders are not slowed. (Modules imported before this conftest keep compiled kernels; nothing
outside tests/kernels imports modeld.kernels today.)
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(params=[
    pytest.param("cpu", marks=pytest.mark.skipif(
        not INTERPRETING, reason="Triton on CPU tensors needs TRITON_INTERPRET=1 (set here only without a GPU)")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
])
def device(request):
    """Devices on which Triton kernels can run in this process."""
    return request.param
