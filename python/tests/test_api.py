"""The package's surface without collectives: constants from the header, exception classes,
argument conversion, unique ids, packaged files."""

from __future__ import annotations

import ctypes
import pickle
import re

import numpy as np
import pytest

import symm
from symm import _abi, _lib, errors


def header_text() -> str:
    return symm.paths.header_path().read_text()


def test_constants_are_the_headers() -> None:
    """Every enumerator of symm.h, with its value, is a member (read, not retyped)."""
    text = header_text()
    for enum_type, python_enum in [
        ("symmResult_t", symm.Result),
        ("symmDataType_t", symm.DataType),
        ("symmRedOp_t", symm.RedOp),
    ]:
        body = re.search(r"typedef enum \{([^}]*)\} " + enum_type + ";", text)
        assert body is not None
        declared = dict(re.findall(r"^\s*(symm\w+) = (\d+),", body.group(1), re.MULTILINE))
        assert declared, enum_type
        assert {m.name: str(m.value) for m in python_enum} == declared
    assert _abi.UNIQUE_ID_BYTES == int(re.search(r"#define SYMM_UNIQUE_ID_BYTES (\d+)", text).group(1))
    assert symm.DataType.symmBfloat16 == _abi.DTYPE_NAMES["bfloat16"]
    assert symm.RedOp.symmAvg == _abi.OP_NAMES["avg"]


def test_parse_enums_rejects_an_enumerator_without_value() -> None:
    with pytest.raises(ValueError, match="enumerator"):
        _abi.parse_enums("typedef enum { a = 1, b } t;")
    assert _abi.parse_enums("typedef enum {\n  // c\n  x = 0x10,\n  y = 3,\n} e;") == {"e": {"x": 16, "y": 3}}


def test_version_matches_the_header() -> None:
    major, minor, patch = symm.version()
    assert major * 10000 + minor * 100 + patch == _abi.VERSION_CODE


def test_every_result_code_has_its_own_exception_class() -> None:
    failures = [code for code in symm.Result if code != symm.Result.symmSuccess]
    classes = {errors.error_class(code) for code in failures}
    assert len(classes) == len(failures)
    for code in failures:
        cls = errors.error_class(code)
        assert issubclass(cls, symm.SymmError) and cls is not symm.SymmError
        error = errors.make_error(code, "what went wrong")
        assert error.code == code and error.message == "what went wrong"
        assert code.name in str(error)
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is cls and again.code == code and again.message == error.message
    assert errors.error_class(1000) is symm.SymmError
    # No class shadows a built-in name.
    import builtins

    for name in errors.__all__:
        assert not hasattr(builtins, name), name
    assert issubclass(symm.InvalidArgumentError, ValueError)
    assert issubclass(symm.OutOfMemoryError, MemoryError)


def test_library_messages_reach_the_exception() -> None:
    """A failing C call raises with symmGetLastError's text (which names the argument)."""
    with pytest.raises(symm.InvalidArgumentError, match=r"symmCommInitAll: comms is NULL") as raised:
        _lib.check(_lib.lib.symmCommInitAll(None, 2, None))
    assert raised.value.code == symm.Result.symmInvalidArgument


class FakeTorchDtype:
    """Stands for a torch dtype: only its str is used."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("float32", "float32"),
        ("f32", "float32"),
        ("FLOAT", "float32"),
        (np.float32, "float32"),
        (np.dtype("<f4"), "float32"),
        (np.dtype(np.float16), "float16"),
        ("bf16", "bfloat16"),
        (FakeTorchDtype("bfloat16"), "bfloat16"),
        (FakeTorchDtype("float8_e4m3fn"), "float8e4m3"),
        (FakeTorchDtype("float8_e5m2"), "float8e5m2"),
        (FakeTorchDtype("int64"), "int64"),
        (FakeTorchDtype("half"), "float16"),
        (np.uint64, "uint64"),
        ("int8", "int8"),
        (symm.DataType.symmUint32, "uint32"),
        (int(symm.DataType.symmFloat64), "float64"),
    ],
)
def test_dtype_spellings(spelling: object, expected: str) -> None:
    assert symm.resolve_dtype(spelling) == _abi.DTYPE_NAMES[expected]


@pytest.mark.parametrize(
    "bad", ["float128", "complex64", "", np.bool_, np.complex128, FakeTorchDtype("bool"), 99, -1, True, None]
)
def test_unknown_dtypes_raise(bad: object) -> None:
    with pytest.raises(symm.InvalidArgumentError, match="dtype"):
        symm.resolve_dtype(bad)


def test_op_spellings_and_errors() -> None:
    assert symm.resolve_op("sum") == symm.RedOp.symmSum
    assert symm.resolve_op("AVG") == symm.RedOp.symmAvg
    assert symm.resolve_op("mean") == symm.RedOp.symmAvg
    assert symm.resolve_op(int(symm.RedOp.symmMax)) == symm.RedOp.symmMax
    assert symm.resolve_op(symm.RedOp.symmProd) == symm.RedOp.symmProd
    for bad in ["median", "", 17, -1, None, 1.0]:
        with pytest.raises(symm.InvalidArgumentError, match="op"):
            symm.resolve_op(bad)


def test_dtype_sizes_and_numpy_types() -> None:
    sizes = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}
    sizes |= {"float16": 2, "float32": 4, "float64": 8, "bfloat16": 2, "float8e4m3": 1, "float8e5m2": 1}
    assert {name: symm.dtype_size(name) for name in _abi.DTYPE_NAMES} == sizes
    assert symm.numpy_dtype("float16") == np.float16
    assert symm.numpy_dtype("bf16") == np.uint16
    assert symm.numpy_dtype("float8e4m3") == np.uint8
    assert symm.numpy_dtype(np.bool_) == np.bool_


def test_stream_arguments() -> None:
    from symm._convert import resolve_stream

    class TorchLike:
        cuda_stream = 0x1234

    class NumbaLike:
        handle = ctypes.c_void_p(0x99)

    class CupyLike:
        ptr = 7

    assert resolve_stream(None) == 0
    assert resolve_stream(5) == 5
    assert resolve_stream(TorchLike()) == 0x1234
    assert resolve_stream(NumbaLike()) == 0x99
    assert resolve_stream(CupyLike()) == 7
    assert resolve_stream(ctypes.c_void_p()) == 0
    for bad in [object(), -1, 1 << 64, "stream", True]:
        with pytest.raises(symm.InvalidArgumentError, match="stream"):
            resolve_stream(bad)


def test_unique_id_travels_as_bytes_hex_and_pickle() -> None:
    uid = symm.get_unique_id()
    raw = bytes(uid)
    assert len(raw) == _abi.UNIQUE_ID_BYTES
    assert symm.UniqueId(raw) == uid
    assert symm.UniqueId.from_hex(uid.hex()) == uid
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert symm.get_unique_id() != uid
    with pytest.raises(symm.InvalidArgumentError, match="bytes"):
        symm.UniqueId(b"short")
    with pytest.raises(symm.InvalidArgumentError, match="hex"):
        symm.UniqueId.from_hex("zz")


def test_packaged_files() -> None:
    assert symm.LIBRARY_PATH.is_file()
    assert symm.paths.header_path().name == "symm.h"
    assert symm.paths.data_file("symm.h") == symm.paths.header_path()
    with pytest.raises(FileNotFoundError, match="no-such-file"):
        symm.paths.data_file("no-such-file")
    library = symm.paths.triton_library_path()
    assert library.name == "symm_triton.ll" and library.is_file()
    assert b"define noundef i32 @symm_all_reduce(" in library.read_bytes()
    for engine in ("nvshmem", "nccl"):
        path = symm.paths.triton_library_path(engine)
        assert path.name == f"symm_triton_{engine}.ll" and path.is_file()
        text = path.read_bytes()
        assert f"define noundef i32 @symm_{engine}_all_reduce(".encode() in text
        assert f"define noundef i32 @symm_dispatch_{engine}_all_reduce(".encode() in text
        # The native functions it dispatches to are the native library's.
        assert b"declare noundef i32 @symm_all_reduce(" in text


def test_a_compressed_data_file_is_decompressed_once_and_again_when_it_changes(tmp_path) -> None:
    import gzip
    import os

    from symm import _paths

    compressed = tmp_path / "data.ll.gz"
    compressed.write_bytes(gzip.compress(b"first version\n"))
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path)  # a link is never used, wherever it points
    cache = tmp_path / "cache"
    directories = [planted, cache]
    out = _paths._decompressed(compressed, directories)
    assert out == cache / "data.ll" and out.read_bytes() == b"first version\n"
    assert not (tmp_path / "data.ll").exists()
    assert out.stat().st_mtime_ns == compressed.stat().st_mtime_ns
    # Reused while up to date: a change of the same size keeping the time stays.
    stamp = out.stat().st_mtime_ns
    out.write_bytes(b"first versioN\n")
    os.utime(out, ns=(stamp, stamp))
    assert _paths._decompressed(compressed, directories).read_bytes() == b"first versioN\n"
    # A rebuilt library of the same size (another time) is decompressed again, once.
    compressed.write_bytes(gzip.compress(b"other version\n"))
    os.utime(compressed, ns=(stamp - 10**9, stamp - 10**9))  # older, as a checkout may leave it
    assert _paths._decompressed(compressed, directories).read_bytes() == b"other version\n"
    out.write_bytes(b"other versioN\n")
    os.utime(out, ns=(stamp - 10**9, stamp - 10**9))
    assert _paths._decompressed(compressed, directories).read_bytes() == b"other versioN\n"
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]
    # Not a gzip file: a clear error, nothing left behind.
    broken = tmp_path / "broken.ll.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(FileNotFoundError, match="broken.ll.gz"):
        _paths._decompressed(broken, [cache])
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]
