"""Kernel tests: every Triton kernel against its torch reference, on CPU through Triton's interpreter
(TRITON_INTERPRET is set in tests/conftest.py when there is no GPU), on CUDA compiled."""

import os

import pytest

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(
    params=[
        pytest.param(
            "cpu",
            marks=pytest.mark.skipif(
                not INTERPRETING, reason="Triton on CPU tensors needs TRITON_INTERPRET=1 (set here only without a GPU)"
            ),
        ),
        pytest.param("cuda", marks=pytest.mark.gpu),
    ]
)
def device(request):
    """Devices on which Triton kernels can run in this process."""
    return request.param
