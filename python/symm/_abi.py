"""The C ABI's constants, read from the packaged ``symm.h`` at import time (never retyped).

* :data:`Result` — ``symmResult_t`` (``Result.symmInvalidArgument``, ...);
* :data:`DataType` — ``symmDataType_t`` (``DataType.symmFloat32``, ...);
* :data:`RedOp` — ``symmRedOp_t`` (``RedOp.symmSum``, ...);
* :data:`DEFINES` — the header's integer ``#define`` constants (``SYMM_UNIQUE_ID_BYTES``, ...).

Each enum is an :class:`enum.IntEnum` whose members carry the header's names and values, so
``int(DataType.symmBfloat16)`` is what the C library and the Triton device functions expect.
:data:`DTYPE_NAMES` and :data:`OP_NAMES` give the short names (``"bfloat16"``, ``"sum"``) derived
from the header's names by dropping the ``symm`` prefix.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

from . import _paths

__all__ = [
    "DEFINES",
    "DTYPE_NAMES",
    "HEADER",
    "OP_NAMES",
    "OWNER_NAMES",
    "UNIQUE_ID_BYTES",
    "VERSION_CODE",
    "WIN_COLL_SYMMETRIC",
    "DataType",
    "Owner",
    "RedOp",
    "Result",
    "parse_defines",
    "parse_enums",
]

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_ENUM = re.compile(r"typedef\s+enum\s*\{(?P<body>[^}]*)\}\s*(?P<name>\w+)\s*;")
_ENUMERATOR = re.compile(r"^\s*(?P<name>\w+)\s*=\s*(?P<value>-?(?:0[xX][0-9a-fA-F]+|\d+))\s*$")
_DEFINE = re.compile(r"^\s*#\s*define\s+(?P<name>\w+)\s+(?P<value>-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*$")


def parse_enums(text: str) -> dict[str, dict[str, int]]:
    """Every ``typedef enum { name = value, ... } type;`` of a C header, by type name.

    Raises:
        ValueError: an enumerator without an explicit integer value (cbindgen always writes one).
    """
    stripped = _COMMENT.sub("", text)
    enums: dict[str, dict[str, int]] = {}
    for match in _ENUM.finditer(stripped):
        members: dict[str, int] = {}
        for item in match.group("body").split(","):
            if not item.strip():
                continue
            enumerator = _ENUMERATOR.match(item)
            if enumerator is None:
                raise ValueError(f"cannot read enumerator {item.strip()!r} of {match.group('name')}")
            members[enumerator.group("name")] = int(enumerator.group("value"), 0)
        enums[match.group("name")] = members
    return enums


def parse_defines(text: str) -> dict[str, int]:
    """Every ``#define NAME <integer>`` of a C header."""
    defines: dict[str, int] = {}
    for line in _COMMENT.sub("", text).splitlines():
        match = _DEFINE.match(line)
        if match is not None:
            defines[match.group("name")] = int(match.group("value"), 0)
    return defines


def _load(path: Path) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    text = path.read_text(encoding="utf-8")
    enums = parse_enums(text)
    for required in ("symmResult_t", "symmDataType_t", "symmRedOp_t"):
        if not enums.get(required):
            raise ImportError(f"{path} declares no {required}: not a symm header")
    return enums, parse_defines(text)


def _short_name(member: str) -> str:
    """``symmFloat8e4m3`` -> ``float8e4m3``."""
    if not member.startswith("symm"):
        raise ImportError(f"enumerator {member} of symm.h lacks the symm prefix")
    return member[len("symm") :].lower()


#: The header the constants were read from.
HEADER: Path = _paths.header_path()
_ENUMS, DEFINES = _load(HEADER)

#: ``symmResult_t``, as read from the header.
Result = enum.IntEnum("Result", _ENUMS["symmResult_t"], module=__name__)  # type: ignore[misc]
#: ``symmDataType_t``, as read from the header.
DataType = enum.IntEnum("DataType", _ENUMS["symmDataType_t"], module=__name__)  # type: ignore[misc]
#: ``symmRedOp_t``, as read from the header.
RedOp = enum.IntEnum("RedOp", _ENUMS["symmRedOp_t"], module=__name__)  # type: ignore[misc]

#: ``symmOwner_t``: who owns a window's memory (:meth:`symm.Comm.register_peers`).
Owner = enum.IntEnum("Owner", _ENUMS["symmOwner_t"], module=__name__)  # type: ignore[misc]
#: Short owner names (``"user"``, ``"torch"``, ``"nccl"``, ``"nvshmem"``) to members.
OWNER_NAMES: dict[str, Owner] = {m.name.removeprefix("symmOwner").lower(): m for m in Owner}  # type: ignore[valid-type]

#: Short data-type names (``"float32"``, ``"bfloat16"``, ``"float8e4m3"``, ...) to members.
DTYPE_NAMES: dict[str, DataType] = {_short_name(m.name): m for m in DataType}  # type: ignore[valid-type]
#: Short operator names (``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"``) to members.
OP_NAMES: dict[str, RedOp] = {_short_name(m.name): m for m in RedOp}  # type: ignore[valid-type]

#: Bytes of a ``symmUniqueId``.
UNIQUE_ID_BYTES: int = DEFINES["SYMM_UNIQUE_ID_BYTES"]
#: The window flag of a symmetric window.
WIN_COLL_SYMMETRIC: int = DEFINES["SYMM_WIN_COLL_SYMMETRIC"]
#: The version of the header: ``major * 10000 + minor * 100 + patch``.
VERSION_CODE: int = DEFINES["SYMM_VERSION_CODE"]
