"""A tiny GGUF writer for tests: builds the bytes of a file from metadata and
tensors and records where each section starts, so tests can corrupt exactly
one field.  Independent of minfer's reader (and of the `gguf` package)."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}


def gguf_string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype: int, value, elem_type: int | None = None) -> bytes:
    if vtype == STR:
        return gguf_string(value)
    if vtype == ARR:
        out = struct.pack("<IQ", elem_type, len(value))
        for v in value:
            if elem_type == ARR:
                inner_type, inner = v
                out += gguf_value(ARR, inner, inner_type)
            else:
                out += gguf_value(elem_type, v)
        return out
    return struct.pack(_FMT[vtype], value)


@dataclass
class Built:
    data: bytes
    offsets: dict = field(default_factory=dict)  # section name -> byte offset


def build_gguf(kv: list, tensors: list, version: int = 3, alignment: int = 32,
               tensor_offsets: list | None = None) -> Built:
    """kv: [(key, vtype, value[, elem_type])]; tensors: [(name, ggml_type, dims (ne0 first), raw bytes)].
    Writes general.alignment only if it is among kv."""
    offs = {}
    out = bytearray(b"GGUF")
    offs["version"] = len(out)
    out += struct.pack("<I", version)
    offs["n_tensors"] = len(out)
    out += struct.pack("<Q", len(tensors))
    offs["n_kv"] = len(out)
    out += struct.pack("<Q", len(kv))
    for i, item in enumerate(kv):
        key, vtype, value = item[:3]
        elem = item[3] if len(item) > 3 else None
        offs[f"kv{i}"] = len(out)
        out += gguf_string(key)
        offs[f"kv{i}.type"] = len(out)
        out += struct.pack("<I", vtype)
        offs[f"kv{i}.value"] = len(out)
        out += gguf_value(vtype, value, elem)
    # data layout: each tensor aligned
    data_offsets, cursor = [], 0
    for _, _, _, raw in tensors:
        cursor = (cursor + alignment - 1) // alignment * alignment
        data_offsets.append(cursor)
        cursor += len(raw)
    if tensor_offsets is not None:
        data_offsets = tensor_offsets
    for i, (name, ttype, dims, _) in enumerate(tensors):
        offs[f"t{i}"] = len(out)
        out += gguf_string(name)
        offs[f"t{i}.n_dims"] = len(out)
        out += struct.pack("<I", len(dims))
        offs[f"t{i}.dims"] = len(out)
        for d in dims:
            out += struct.pack("<Q", d)
        offs[f"t{i}.type"] = len(out)
        out += struct.pack("<I", ttype)
        offs[f"t{i}.offset"] = len(out)
        out += struct.pack("<Q", data_offsets[i])
    offs["infos_end"] = len(out)
    data_start = (len(out) + alignment - 1) // alignment * alignment
    out += b"\0" * (data_start - len(out))
    offs["data"] = data_start
    for i, (_, _, _, raw) in enumerate(tensors):
        pos = data_start + data_offsets[i]
        if len(out) < pos:
            out += b"\0" * (pos - len(out))
        out[pos:pos + len(raw)] = raw
    return Built(bytes(out), offs)


def f32_tensor(name: str, arr: np.ndarray):
    a = np.ascontiguousarray(arr, dtype=np.float32)
    return (name, 0, list(reversed(a.shape)), a.tobytes())
