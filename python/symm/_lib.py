"""ctypes bindings of ``libsymm.so``: every function of ``symm.h`` with its argument and result
types declared, and :func:`check`, which turns a failed ``symmResult_t`` into an exception."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_void_p

from . import _paths
from ._abi import UNIQUE_ID_BYTES, Result
from .errors import make_error

__all__ = ["LIBRARY_PATH", "ConfigStruct", "PeerWindowStruct", "UniqueIdStruct", "check", "last_error", "lib"]


class UniqueIdStruct(ctypes.Structure):
    """``symmUniqueId``: opaque bytes, passed by value."""

    _fields_ = [("internal", c_char * UNIQUE_ID_BYTES)]


class ConfigStruct(ctypes.Structure):
    """``symmConfig_t``."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", c_int),
        ("minCTAs", c_int),
        ("maxCTAs", c_int),
    ]


class PeerWindowStruct(ctypes.Structure):
    """``symmPeerWindow_t``."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("owner", c_int),
        ("buff", c_void_p),
        ("bytes", c_size_t),
        ("ownerOffset", c_size_t),
        ("peerBuffs", POINTER(c_void_p)),
        ("peerSignalPads", POINTER(c_void_p)),
        ("signalPadBytes", c_size_t),
    ]


# The enums are C `int`s (`symmResult_t`, `symmDataType_t`, `symmRedOp_t`); handles are
# pointers (`symmComm_t`, `symmWindow_t`, `symmStream_t`).
_result = c_int
_comm = c_void_p
_window = c_void_p
_stream = c_void_p

_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "symmGetVersion": (_result, [POINTER(c_int)]),
    "symmGetErrorString": (c_char_p, [c_int]),
    "symmGetLastError": (c_char_p, [_comm]),
    "symmGetUniqueId": (_result, [POINTER(UniqueIdStruct)]),
    "symmCommInitRank": (_result, [POINTER(_comm), c_int, UniqueIdStruct, c_int]),
    "symmCommInitAll": (_result, [POINTER(_comm), c_int, POINTER(c_int)]),
    "symmCommInitFromEnv": (_result, [POINTER(_comm), POINTER(c_char_p)]),
    "symmCommDestroy": (_result, [_comm]),
    "symmCommAbort": (_result, [_comm]),
    "symmCommFinalize": (_result, [_comm]),
    "symmCommSplit": (_result, [_comm, c_int, c_int, POINTER(_comm), POINTER(ConfigStruct)]),
    "symmCommRevoke": (_result, [_comm, c_int]),
    "symmCommShrink": (_result, [_comm, POINTER(c_int), c_int, POINTER(_comm), POINTER(ConfigStruct), c_int]),
    "symmCommCount": (_result, [_comm, POINTER(c_int)]),
    "symmCommUserRank": (_result, [_comm, POINTER(c_int)]),
    "symmCommCuDevice": (_result, [_comm, POINTER(c_int)]),
    "symmCommGetBackend": (_result, [_comm, POINTER(c_char_p)]),
    "symmMemAlloc": (_result, [_comm, POINTER(c_void_p), c_size_t]),
    "symmMemFree": (_result, [_comm, c_void_p]),
    "symmCommWindowRegister": (_result, [_comm, c_void_p, c_size_t, POINTER(_window), c_int]),
    "symmCommWindowRegisterPeers": (_result, [_comm, POINTER(PeerWindowStruct), POINTER(_window)]),
    "symmCommWindowRegisterNvshmem": (_result, [_comm, c_void_p, c_size_t, POINTER(_window)]),
    "symmWindowSignalPadBytes": (_result, [_comm, POINTER(c_size_t)]),
    "symmCommWindowDeregister": (_result, [_comm, _window]),
    "symmCallRefused": (_result, [c_char_p, c_char_p, _comm]),
    "symmAllReduce": (_result, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmReduce": (_result, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, _comm, _stream]),
    "symmAllGather": (_result, [c_void_p, c_void_p, c_size_t, c_int, _comm, _stream]),
    "symmReduceScatter": (_result, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmBroadcast": (_result, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmAlltoAll": (_result, [c_void_p, c_void_p, c_size_t, c_int, _comm, _stream]),
    "symmAlltoAllvDevice": (_result, [c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_int, _comm, _stream]),
    "symmSend": (_result, [c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmRecv": (_result, [c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmGather": (_result, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmScatter": (_result, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm, _stream]),
    "symmCommGetAsyncError": (_result, [_comm, POINTER(c_int)]),
    "symmGroupStart": (_result, []),
    "symmGroupEnd": (_result, []),
    "symmCommGetDeviceContext": (_result, [_comm, _window, POINTER(c_void_p)]),
}


def _open() -> ctypes.CDLL:
    library = ctypes.CDLL(str(LIBRARY_PATH))
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            function = getattr(library, name)
        except AttributeError as missing:
            raise ImportError(f"{LIBRARY_PATH} does not export {name}: not a matching libsymm") from missing
        function.restype = restype
        function.argtypes = argtypes
    return library


#: The library that was loaded (``$SYMM_LIBRARY`` or the packaged one).
LIBRARY_PATH = _paths.library_path()
#: The loaded library, with every function's types declared.
lib = _open()


def last_error(comm: int | None = None) -> str:
    """``symmGetLastError``: the message of the last failed call of this thread (``comm``
    None) or of ``comm``."""
    message = lib.symmGetLastError(comm)
    return message.decode("utf-8", "replace") if message else ""


def check(result: int) -> None:
    """Raise the exception of ``result`` with this thread's last error message, unless it is
    ``symmSuccess``. Call it right after the C call, on the same thread."""
    if result != Result["symmSuccess"]:
        message = last_error(None)
        if not message:
            description = lib.symmGetErrorString(result)
            message = description.decode("utf-8", "replace") if description else "failed"
        raise make_error(result, message)
