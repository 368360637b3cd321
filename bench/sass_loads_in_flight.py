#!/usr/bin/env python3
"""How many 16-byte loads a kernel has in flight before it waits for one, from its SASS.

A bandwidth kernel on the GPU is limited by the bytes it has in flight (Little's law): a
thread that issues one 16-byte remote load and then uses it waits a whole memory latency per
16 bytes. This reads a SASS listing (``cuobjdump -sass``; needs ``nvdisasm`` on the PATH) and,
for each straight-line stretch of code, counts the 16-byte loads (``LD.E.128``/``LDG.E.128``)
issued before an instruction reads the registers of one of them (or a branch, call or barrier
ends the stretch). It prints the histogram {loads in flight: stretches} and the largest.

Static only: it does not know which stretch runs most, and a load's latency also overlaps
with other warps. Used for the instruction-level figures in bench/RESULTS.md:

    ptxas -arch=sm_90 ptx-out/symm_sm90.ptx -o symm_sm90.cubin   (after gunzip)
    cuobjdump -sass -fun symm_two_shot_all_reduce_f32_sum symm_sm90.cubin > k.sass
    bench/sass_loads_in_flight.py k.sass
"""

from __future__ import annotations

import re
import sys

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?);")
PREDICATE = re.compile(r"^@!?U?P[0-9T]\s+")
REGISTER = re.compile(r"\bR(\d+)\b")
LOAD_16_BYTES = re.compile(r"^(LD|LDG)\.E\.128\b")
ENDS_STRETCH = ("BRA", "EXIT", "BAR", "CALL", "RET", "BSYNC", "WARPSYNC")


def loads_in_flight(lines: list[str]) -> dict[int, int]:
    """{loads in flight when the first of them is used: number of stretches}."""
    pending: set[int] = set()
    in_flight = 0
    histogram: dict[int, int] = {}

    def close() -> None:
        nonlocal in_flight
        if in_flight:
            histogram[in_flight] = histogram.get(in_flight, 0) + 1
        pending.clear()
        in_flight = 0

    for line in lines:
        match = INSTRUCTION.search(line)
        if not match:
            continue
        instruction = PREDICATE.sub("", match.group(1))
        opcode = instruction.split()[0]
        if opcode.startswith(ENDS_STRETCH):
            close()
            continue
        registers = [int(r) for r in REGISTER.findall(instruction)]
        # Stores read every register operand; other instructions write their first.
        sources = registers if opcode.startswith("ST") else registers[1:]
        if pending.intersection(sources):
            close()
        if LOAD_16_BYTES.match(opcode) and registers:
            pending.update(range(registers[0], registers[0] + 4))
            in_flight += 1
    close()
    return dict(sorted(histogram.items()))


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as listing:
            histogram = loads_in_flight(listing.readlines())
        largest = max(histogram) if histogram else 0
        print(f"{path}: at most {largest} in flight; {{in flight: stretches}} {histogram}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
