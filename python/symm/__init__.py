"""symm: symmetric-memory collectives (all-reduce, all-gather, reduce-scatter) from Python.

A thin ctypes layer over ``libsymm.so``; importing it needs neither a GPU nor PyTorch. On a
machine without a GPU (or with ``SYMM_BACKEND=host``) the same kernels run on CPU threads, over
host memory that :meth:`Buffer.numpy` views without a copy. The API reference and a
troubleshooting table: ``docs/PYTHON.md``.

Example (one process driving four ranks)::

    import numpy as np, symm

    comms = symm.Comm.init_all(4)
    bufs = [c.alloc(1024, "float32") for c in comms]
    for r, b in enumerate(bufs):
        b.numpy()[:] = r
    with symm.group():
        wins = [c.register(b) for c, b in zip(comms, bufs)]
    with symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b)  # count and dtype from the typed buffer; in place
    assert (np.asarray(bufs[0]) == 6).all()

The C constants are read from the packaged ``symm.h``: :class:`Result`, :class:`DataType`,
:class:`RedOp`. Every failure raises a subclass of :class:`SymmError`.
"""

from __future__ import annotations

from . import _paths as paths
from ._abi import DataType, Owner, RedOp, Result
from ._convert import DTypeLike, OpLike, StreamLike, dtype_size, numpy_dtype, resolve_dtype, resolve_op
from ._core import (
    SPLIT_NOCOLOR,
    Buffer,
    BufferLike,
    Comm,
    CudaArrayView,
    UniqueId,
    Window,
    get_unique_id,
    group,
    version,
)
from ._lib import LIBRARY_PATH
from .errors import (
    CoResidencyError,
    InternalError,
    InvalidArgumentError,
    InvalidUsageError,
    NoDeviceError,
    OutOfMemoryError,
    RemoteError,
    SymmError,
    SymmSystemError,
    SymmTimeoutError,
    UnhandledCudaError,
    UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "LIBRARY_PATH",
    "SPLIT_NOCOLOR",
    "Buffer",
    "BufferLike",
    "CoResidencyError",
    "Comm",
    "CudaArrayView",
    "DTypeLike",
    "DataType",
    "InternalError",
    "InvalidArgumentError",
    "InvalidUsageError",
    "NoDeviceError",
    "OpLike",
    "OutOfMemoryError",
    "Owner",
    "RedOp",
    "RemoteError",
    "Result",
    "StreamLike",
    "SymmError",
    "SymmSystemError",
    "SymmTimeoutError",
    "UnhandledCudaError",
    "UniqueId",
    "UnsupportedError",
    "Window",
    "dtype_size",
    "get_unique_id",
    "group",
    "numpy_dtype",
    "paths",
    "resolve_dtype",
    "resolve_op",
    "version",
]
