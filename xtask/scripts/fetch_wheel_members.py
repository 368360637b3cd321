"""Fetch single files out of wheels on PyPI without downloading the wheels: the zip's central
directory and each wanted member are read with HTTP range requests (a wheel is a zip; the
NVIDIA wheels are 70-300 MB, the files the checks read a few MB).

    python3 fetch_wheel_members.py OUT PACKAGE==VERSION:MEMBER [...]

Each MEMBER (a path inside the wheel) lands at OUT/PACKAGE-VERSION/<basename>; a file already
there is kept. Prints one line per file. Standard library only.
"""

from __future__ import annotations

import json
import struct
import sys
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

INDEX = "https://pypi.org/pypi/{package}/json"
PLATFORM = "x86_64"


def get(url: str, start: int | None = None, end: int | None = None) -> bytes:
    request = urllib.request.Request(url)
    if start is not None:
        request.add_header("Range", f"bytes={start}-{'' if end is None else end}")
    for attempt in range(4):
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                data = response.read()
                if start is not None and response.status != 206:
                    raise RuntimeError(f"{url}: the server ignored the range request (status {response.status})")
                return data
        except OSError:
            if attempt == 3:
                raise
            time.sleep(2 * (attempt + 1))
    raise AssertionError("unreachable")


def wheel_url(package: str, version: str) -> tuple[str, int]:
    index = INDEX.format(package=package)
    releases = json.loads(get(index))["releases"]
    if version not in releases:
        raise SystemExit(f"{package} has no release {version} on PyPI")
    for entry in releases[version]:
        if entry["filename"].endswith(".whl") and PLATFORM in entry["filename"]:
            # Mirrors of the index may give the file's address relative to the index's.
            return urllib.parse.urljoin(index, entry["url"]), int(entry["size"])
    raise SystemExit(f"{package}=={version} has no {PLATFORM} wheel")


def central_directory(url: str, size: int) -> dict[str, tuple[int, int, int, int]]:
    """Member name -> (method, compressed size, uncompressed size, local header offset)."""
    tail = get(url, max(0, size - 65536 - 22), size - 1)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0:
        raise RuntimeError(f"{url}: no end of central directory")
    entries, cd_size, cd_offset = struct.unpack("<10xHII", tail[at : at + 20])
    zip64 = tail.rfind(b"PK\x06\x06")
    if cd_offset == 0xFFFFFFFF and zip64 >= 0:
        cd_size, cd_offset = struct.unpack("<40xQQ", tail[zip64 : zip64 + 56])
    data = get(url, cd_offset, cd_offset + cd_size - 1)
    members, pos = {}, 0
    while pos + 46 <= len(data) and data[pos : pos + 4] == b"PK\x01\x02":
        method, csize, usize = struct.unpack("<10xH8xII", data[pos : pos + 28])
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[pos + 28 : pos + 34])
        offset = struct.unpack("<I", data[pos + 42 : pos + 46])[0]
        name = data[pos + 46 : pos + 46 + name_len].decode()
        extra = data[pos + 46 + name_len : pos + 46 + name_len + extra_len]
        # Zip64 extra field: the sizes and offset that overflowed 32 bits, in that order.
        e = 0
        while e + 4 <= len(extra):
            tag, length = struct.unpack("<HH", extra[e : e + 4])
            if tag == 1:
                values = list(struct.unpack(f"<{length // 8}Q", extra[e + 4 : e + 4 + length]))
                if usize == 0xFFFFFFFF:
                    usize = values.pop(0)
                if csize == 0xFFFFFFFF:
                    csize = values.pop(0)
                if offset == 0xFFFFFFFF:
                    offset = values.pop(0)
            e += 4 + length
        members[name] = (method, csize, usize, offset)
        pos += 46 + name_len + extra_len + comment_len
    return members


def fetch(url: str, member: tuple[int, int, int, int]) -> bytes:
    method, csize, usize, offset = member
    header = get(url, offset, offset + 29)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = offset + 30 + name_len + extra_len
    raw = get(url, start, start + csize - 1) if csize else b""
    if method == 0:
        data = raw
    elif method == 8:
        data = zlib.decompress(raw, -15)
    else:
        raise RuntimeError(f"compression method {method} is not supported")
    if len(data) != usize:
        raise RuntimeError(f"{len(data)} bytes unpacked, {usize} expected")
    return data


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    wanted: dict[tuple[str, str], list[str]] = {}
    for spec in sys.argv[2:]:
        requirement, member = spec.split(":", 1)
        package, version = requirement.split("==")
        wanted.setdefault((package, version), []).append(member)
    for (package, version), members in wanted.items():
        folder = out / f"{package}-{version}"
        missing = [m for m in members if not (folder / Path(m).name).is_file()]
        for m in members:
            if m not in missing:
                print(f"{folder / Path(m).name}: kept")
        if not missing:
            continue
        url, size = wheel_url(package, version)
        directory = central_directory(url, size)
        folder.mkdir(parents=True, exist_ok=True)
        for m in missing:
            if m not in directory:
                raise SystemExit(f"{package}=={version}'s wheel has no {m}")
            began = time.monotonic()
            data = fetch(url, directory[m])
            target = folder / Path(m).name
            partial = target.with_suffix(target.suffix + ".part")
            partial.write_bytes(data)
            partial.rename(target)
            print(f"{target}: {len(data)} bytes ({directory[m][1]} fetched of a {size}-byte wheel, "
                  f"{time.monotonic() - began:.1f} s)")


if __name__ == "__main__":
    main()
