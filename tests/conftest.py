"""Process-wide test set-up.

Without a GPU, Triton kernels run only through Triton's interpreter, and TRITON_INTERPRET must be
set before any kernel is defined (when modeld.kernels is first imported), so it is set here,
before any test module is imported. On a GPU machine it stays unset: kernels run compiled.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
