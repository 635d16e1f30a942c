"""Quantized types and the CPU kernels, for tests, tools and benchmarks.

Type ids are ggml's (`GGMLType.Q4_K == 12`).  Every function takes raw block
bytes as numpy uint8 arrays, exactly as they sit in a GGUF file.
"""
from __future__ import annotations

import enum

import numpy as np

from . import _minfer


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ4_NL = 20
    IQ4_XS = 23
    BF16 = 30


WEIGHT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
                GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS]


def type_info(t: int) -> tuple[str, int, int, bool]:
    """(name, values per block, bytes per block, known)."""
    return _minfer.type_info(int(t))


def block_size(t: int) -> int:
    return type_info(t)[1]


def row_bytes(t: int, n: int) -> int:
    _, bs, ts, _ = type_info(t)
    return n // bs * ts


def vec_dot_type(t: int) -> GGMLType:
    return GGMLType(_minfer.vec_dot_type(int(t)))


def dequantize(data: np.ndarray, t: int) -> np.ndarray:
    """Flat float32 values of a run of blocks (bit-exact with ggml)."""
    return _minfer.dequantize(np.ascontiguousarray(data), int(t))


def quantize(x: np.ndarray, t: int) -> np.ndarray:
    """Reference quantizer for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 (and F16/F32): flat uint8."""
    return _minfer.quantize(np.ascontiguousarray(x, dtype=np.float32), int(t))


def quantize_act(x: np.ndarray, t: int, isa: str | None = None) -> np.ndarray:
    """Activation quantizer (Q8_0, Q8_1, Q8_K): flat uint8.  The scalar reference, or the
    quantizer of `isa` (the one the matrix products use; the same bytes)."""
    return _minfer.quantize_act(np.ascontiguousarray(x, dtype=np.float32), int(t), isa)


def swiglu(g: np.ndarray, u: np.ndarray, isa: str | None = None) -> np.ndarray:
    """silu(g) * u (flat float32) with one ISA's kernel (the CPU backend's FFN gate)."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32).ravel()  # noqa: E731
    return _minfer.swiglu(f32(g), f32(u), isa)


def geglu(g: np.ndarray, u: np.ndarray, isa: str | None = None) -> np.ndarray:
    """gelu(g) * u, GELU in its tanh form (flat float32), with one ISA's kernel (gemma's FFN gate)."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32).ravel()  # noqa: E731
    return _minfer.geglu(f32(g), f32(u), isa)


def vec_dot(t: int, w: np.ndarray, a: np.ndarray, isa: str | None = None) -> float:
    """dot(weight blocks of type t, activation blocks of vec_dot_type(t)) with one ISA's kernel."""
    return _minfer.vec_dot(int(t), np.ascontiguousarray(w), np.ascontiguousarray(a), isa)


def matmul(w: np.ndarray, t: int, x: np.ndarray, pool=None, isa: str | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """Y[n_tok, rows] = X W^T; w holds `rows` rows of type t (raw bytes or f32/f16 values)."""
    return _minfer.matmul(np.ascontiguousarray(w), int(t), x, pool, isa, out)


def matmul_ref(w: np.ndarray, t: int, x: np.ndarray) -> np.ndarray:
    """float64 reference of matmul over the dequantized weights and quantized-then-dequantized x."""
    return _minfer.matmul_ref(np.ascontiguousarray(w), int(t), x)


def available_isas() -> list[str]:
    return _minfer.available_isas()


def default_isa() -> str:
    return _minfer.default_isa()


ThreadPool = _minfer.ThreadPool
physical_cores = _minfer.physical_cores
