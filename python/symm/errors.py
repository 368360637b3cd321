"""Exceptions: :class:`SymmError` and one subclass per ``symmResult_t`` code.

Every failed C call raises the subclass of its result code, carrying the code
(:attr:`SymmError.code`, a :class:`symm.Result` member) and the library's message
(``symmGetLastError``), which names the bad argument. Arguments the package rejects before
calling the library (an unknown dtype string, a buffer that is too small, a destroyed
communicator) raise the same classes with the package's own message.

Some classes also derive from the matching built-in exception, so generic handlers work:
:class:`InvalidArgumentError` is a :class:`ValueError`, :class:`OutOfMemoryError` a
:class:`MemoryError`. None of them shadows a built-in name.
"""

from __future__ import annotations

from ._abi import Result

__all__ = [
    "CoResidencyError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidUsageError",
    "NoDeviceError",
    "OutOfMemoryError",
    "RemoteError",
    "SymmError",
    "SymmSystemError",
    "SymmTimeoutError",
    "UnhandledCudaError",
    "UnsupportedError",
    "error_class",
    "make_error",
]


class SymmError(Exception):
    """A symm call failed.

    Attributes:
        code: the ``symmResult_t`` of the failure.
        message: what went wrong (``symmGetLastError``'s text for a failed C call).
    """

    #: The header's name of the result code this class stands for.
    result_name: str = ""

    def __init__(self, message: str, code: Result | int | None = None) -> None:
        if code is None:
            code = Result[self.result_name] if self.result_name else Result["symmInternalError"]
        try:
            self.code: Result | int = Result(code)
        except ValueError:
            self.code = int(code)
        self.message = message
        name = self.code.name if isinstance(self.code, Result) else f"symmResult_t {self.code}"
        super().__init__(f"{name}: {message}")

    def __reduce__(self) -> tuple[type[SymmError], tuple[str, int]]:
        return (type(self), (self.message, int(self.code)))


class UnhandledCudaError(SymmError):
    """``symmUnhandledCudaError``: a CUDA driver call or a kernel failed."""

    result_name = "symmUnhandledCudaError"


class SymmSystemError(SymmError):
    """``symmSystemError``: a system call failed."""

    result_name = "symmSystemError"


class InternalError(SymmError):
    """``symmInternalError``: an internal invariant was broken, or a kernel refused its launch."""

    result_name = "symmInternalError"


class InvalidArgumentError(SymmError, ValueError):
    """``symmInvalidArgument``: an argument is invalid; the message names it."""

    result_name = "symmInvalidArgument"


class InvalidUsageError(SymmError):
    """``symmInvalidUsage``: the call is not valid in the current state (e.g. after destroy)."""

    result_name = "symmInvalidUsage"


class CoResidencyError(InvalidUsageError):
    """``symmInvalidUsage``, raised by ``symm.triton`` before a launch: the programs of every
    rank sharing the GPU cannot all be resident at once, so the launch would time out. The
    message gives the numbers and what to change."""


class NoDeviceError(SymmError):
    """``symmNoDevice``: no usable GPU or CUDA driver for the cuda backend."""

    result_name = "symmNoDevice"


class UnsupportedError(SymmError):
    """``symmUnsupported``: valid, but not supported by this version or this GPU."""

    result_name = "symmUnsupported"


class SymmTimeoutError(SymmError):
    """``symmTimeout``: a peer did not arrive within ``SYMM_TIMEOUT_MS``."""

    result_name = "symmTimeout"


class OutOfMemoryError(SymmError, MemoryError):
    """``symmOutOfMemory``: an allocation failed."""

    result_name = "symmOutOfMemory"


class RemoteError(SymmError):
    """``symmRemoteError``: a peer's process exited or its bootstrap connection was lost."""

    result_name = "symmRemoteError"


_CLASSES: dict[str, type[SymmError]] = {
    cls.result_name: cls
    for cls in (
        UnhandledCudaError,
        SymmSystemError,
        InternalError,
        InvalidArgumentError,
        InvalidUsageError,
        NoDeviceError,
        UnsupportedError,
        SymmTimeoutError,
        OutOfMemoryError,
        RemoteError,
    )
}


def error_class(code: Result | int) -> type[SymmError]:
    """The exception class of a result code (:class:`SymmError` for a code this package lacks)."""
    try:
        return _CLASSES.get(Result(code).name, SymmError)
    except ValueError:
        return SymmError


def make_error(code: Result | int, message: str) -> SymmError:
    """An exception of the class of ``code`` with ``message``."""
    return error_class(code)(message, code)
