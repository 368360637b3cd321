"""Independent references for the collective tests: element encodings and reductions computed
in float64 or exact Python integers, with NumPy only (no code shared with the package)."""

from __future__ import annotations

import numpy as np

#: Every data type the tests cover, by the header's short name.
FLOAT_TYPES = ["float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"]
INT_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64"]
ALL_TYPES = INT_TYPES + FLOAT_TYPES
OPS = ["sum", "prod", "max", "min", "avg"]

#: Storage (bit pattern) NumPy type of each data type.
STORAGE = {
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "uint32": np.uint32,
    "int64": np.int64,
    "uint64": np.uint64,
    "float16": np.uint16,
    "float32": np.uint32,
    "float64": np.uint64,
    "bfloat16": np.uint16,
    "float8e4m3": np.uint8,
    "float8e5m2": np.uint8,
}


def _decode_e4m3(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def _decode_e5m2(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 2) & 0x1F, code & 0x3
    if exponent == 0x1F:
        return sign * float("inf") if mantissa == 0 else float("nan")
    if exponent == 0:
        return sign * mantissa / 4 * 2.0**-14
    return sign * (1 + mantissa / 4) * 2.0 ** (exponent - 15)


def _table(dtype: str) -> np.ndarray:
    """float64 value of every code of a narrow float type (index = code)."""
    if dtype == "bfloat16":
        codes = np.arange(1 << 16, dtype=np.uint32) << 16
        with np.errstate(invalid="ignore"):  # NaN patterns
            return codes.view(np.float32).astype(np.float64)
    if dtype == "float16":
        return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    decode = _decode_e4m3 if dtype == "float8e4m3" else _decode_e5m2
    return np.array([decode(code) for code in range(256)], dtype=np.float64)


_TABLES: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _sorted_table(dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if dtype not in _TABLES:
        values = _table(dtype)
        codes = np.arange(values.size)
        # Finite values, one zero (+0), sorted.
        keep = np.isfinite(values) & ~((values == 0) & (np.signbit(values)))
        order = np.argsort(values[keep], kind="stable")
        _TABLES[dtype] = (values, values[keep][order], codes[keep][order])
    return _TABLES[dtype]


def decode(dtype: str, bits: np.ndarray) -> np.ndarray:
    """Elements stored as ``bits`` (the storage type of ``dtype``) as float64 (or exact Python
    ints, as an object array, for integer types)."""
    if dtype in INT_TYPES:
        return np.array([int(v) for v in bits], dtype=object)
    if dtype == "float32":
        return bits.view(np.float32).astype(np.float64)
    if dtype == "float64":
        return bits.view(np.float64).copy()
    values, _, _ = _sorted_table(dtype)
    return values[bits.astype(np.int64)]


def encode(dtype: str, values: np.ndarray) -> np.ndarray:
    """float64 ``values`` rounded to ``dtype`` (to nearest, ties to even; saturating at the
    largest finite value), as bit patterns in its storage type. Integer types: exact Python ints
    wrapped modulo 2^bits."""
    storage = STORAGE[dtype]
    if dtype in INT_TYPES:
        bits = np.dtype(storage).itemsize * 8
        wrapped = [int(v) % (1 << bits) for v in values]
        return np.array(wrapped, dtype=np.uint64).astype(np.dtype(f"uint{bits}")).view(storage)
    values = np.asarray(values, dtype=np.float64)
    if dtype == "float32":
        return values.astype(np.float32).view(np.uint32)
    if dtype == "float64":
        return values.view(np.uint64).copy()
    _, table, codes = _sorted_table(dtype)
    clipped = np.clip(values, table[0], table[-1])
    upper = np.clip(np.searchsorted(table, clipped), 1, table.size - 1)
    lower = upper - 1
    below, above = clipped - table[lower], table[upper] - clipped
    pick_upper = (above < below) | ((above == below) & (codes[upper] % 2 == 0))
    chosen = np.where(pick_upper, codes[upper], codes[lower])
    return chosen.astype(storage)


def random_inputs(dtype: str, op: str, nranks: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each rank's input, as bit patterns. Floats are chosen so that every exact result of
    ``op`` is representable (then only ``avg`` rounds): integers in [-2, 2] for float8, quarters
    in [-8, 8] for wider floats, and powers of two for ``prod``. Integers span their whole range
    (sums and products wrap)."""
    if dtype in INT_TYPES:
        info = np.iinfo(STORAGE[dtype])
        return [rng.integers(info.min, info.max, count, dtype=STORAGE[dtype], endpoint=True) for _ in range(nranks)]
    if op == "prod":
        choices = np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0])
        return [encode(dtype, rng.choice(choices, count)) for _ in range(nranks)]
    if dtype.startswith("float8"):
        return [encode(dtype, rng.integers(-2, 2, count, endpoint=True).astype(np.float64)) for _ in range(nranks)]
    return [encode(dtype, rng.integers(-32, 32, count, endpoint=True) / 4.0) for _ in range(nranks)]


def reduce(dtype: str, op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The expected all-reduce of ``inputs`` (bit patterns), as bit patterns: exact in Python
    integers (wrapping; avg truncated toward zero) or float64 (rounded once to ``dtype``)."""
    nranks = len(inputs)
    decoded = [decode(dtype, bits) for bits in inputs]
    if dtype in INT_TYPES:
        result = []
        for values in zip(*decoded):
            if op in ("sum", "avg"):
                value = sum(values)
                if op == "avg":
                    value = abs(value) // nranks * (1 if value >= 0 else -1)
            elif op == "prod":
                value = 1
                for v in values:
                    value *= v
            elif op == "max":
                value = max(values)
            else:
                value = min(values)
            result.append(value)
        return encode(dtype, np.array(result, dtype=object))
    stacked = np.stack(decoded)
    if op == "sum":
        exact = stacked.sum(axis=0)
    elif op == "avg":
        exact = stacked.sum(axis=0) / nranks
    elif op == "prod":
        exact = stacked.prod(axis=0)
    elif op == "max":
        exact = stacked.max(axis=0)
    else:
        exact = stacked.min(axis=0)
    return encode(dtype, exact)
