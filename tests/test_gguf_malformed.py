"""Malformed GGUF files: each corruption raises GGUFError with a message that
names the file, the offending field and the numbers.  Never a crash, never a
read out of bounds (the ASan build runs this same table)."""
import struct

import numpy as np
import pytest

import minfer
from gguf_writer import ARR, BOOL, STR, U8, U32, build_gguf, f32_tensor, gguf_string

KV = [("general.architecture", STR, "llama"), ("general.name", STR, "tiny"),
      ("t.arr", ARR, [1, 2, 3], U32), ("t.flag", BOOL, True)]


def base():
    return build_gguf(KV, [f32_tensor("a", np.arange(8).reshape(2, 4)), f32_tensor("b", np.arange(16))])


def patch(data: bytes, off: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def case_list():
    B = base()
    d, o = B.data, B.offsets
    cases = [
        ("empty file", b"", r"truncated: magic needs 4 bytes at offset 0 but only 0 remain"),
        ("truncated magic", d[:2], r"truncated: magic needs 4 bytes"),
        ("bad magic", b"GGML" + d[4:], r"bad magic 0x47474d4c \(expected \"GGUF\"\)"),
        ("version 1", patch(d, o["version"], "<I", 1), r"version 1 is not supported"),
        ("version 7", patch(d, o["version"], "<I", 7), r"unsupported version 7"),
        ("big-endian", patch(d, o["version"], ">I", 3), r"looks byte-swapped: big-endian"),
        ("truncated header", d[:12], r"truncated: tensor count needs 8 bytes at offset 8 but only 4 remain"),
        ("huge n_kv", patch(d, o["n_kv"], "<Q", 2**62), r"metadata count 4611686018427387904 cannot fit in the \d+ bytes"),
        ("huge n_tensors", patch(d, o["n_tensors"], "<Q", 10**12), r"tensor count 1000000000000 cannot fit"),
        ("key length past EOF", patch(d, o["kv0"], "<Q", 10**9),
         r"metadata #0 key length 1000000000 at offset 24 runs past the end of the file"),
        ("truncated in value", d[:o["kv1.value"] + 5], r"truncated: metadata 'general.name' length needs 8 bytes"),
        ("unknown value type", patch(d, o["kv1.type"], "<I", 13), r"metadata 'general.name' has unknown value type 13"),
        ("array huge count", patch(d, o["kv2.value"] + 4, "<Q", 2**40),
         r"metadata 't.arr': array of 1099511627776 uint32 elements .* does not fit"),
        ("array unknown element type", patch(d, o["kv2.value"], "<I", 99),
         r"metadata 't.arr': unknown array element type 99"),
        ("bool not 0/1", patch(d, o["kv3.value"], "<B", 2), r"metadata 't.flag': bool value 2 is neither 0 nor 1"),
        ("string past EOF", patch(d, o["kv1.value"], "<Q", 2**63),
         r"metadata 'general.name' length 9223372036854775808 .* runs past the end"),
        ("tensor name past EOF", patch(d, o["t0"], "<Q", 2**33), r"tensor #0 name length 8589934592 .* runs past"),
        ("truncated tensor infos", d[:o["t1.dims"] + 3], r"truncated: tensor 'b' dimension 0 needs 8 bytes"),
        ("zero dims", patch(d, o["t0.n_dims"], "<I", 0), r"tensor 'a' has 0 dimensions \(1 to 4 allowed\)"),
        ("five dims", patch(d, o["t0.n_dims"], "<I", 5), r"tensor 'a' has 5 dimensions"),
        ("negative dim", patch(d, o["t0.dims"], "<Q", 2**63 + 1), r"tensor 'a' dimension 0 is 9223372036854775809"),
        ("overflowing dims", patch(patch(d, o["t0.dims"], "<Q", 2**40), o["t0.dims"] + 8, "<Q", 2**40),
         r"tensor 'a': the product of its dimensions overflows int64 at dimension 1 \(1099511627776\)"),
        ("unknown tensor type", patch(d, o["t1.type"], "<I", 4), r"tensor 'b' has unknown tensor type id 4"),
        ("tensor type 999", patch(d, o["t1.type"], "<I", 999), r"tensor 'b' has unknown tensor type id 999"),
        ("row not whole blocks", patch(d, o["t1.type"], "<I", 12),
         r"tensor 'b': row length 16 is not a multiple of the Q4_K block size 256"),
        ("misaligned offset", patch(d, o["t1.offset"], "<Q", 33), r"tensor 'b' data offset 33 is not a multiple of the alignment 32"),
        ("offset out of range", patch(d, o["t1.offset"], "<Q", 2**50),
         r"tensor 'b' data \[1125899906842624, 1125899906842688\) \(64 bytes of F32\) lies outside the data section"),
        ("data truncated", d[:-10], r"tensor 'b' data \[32, 96\) \(64 bytes of F32\) lies outside the data section of 86 bytes"),
        ("data section past EOF", d[:o["infos_end"] + 1], r"tensor data section would start at offset \d+, past the end"),
    ]
    dup_t = build_gguf(KV, [f32_tensor("a", np.ones(4)), f32_tensor("a", np.ones(4))]).data
    cases.append(("duplicate tensors", dup_t, r"duplicate tensor name 'a'"))
    dup_k = build_gguf(KV + [("general.name", STR, "again")], []).data
    cases.append(("duplicate keys", dup_k, r"duplicate metadata key 'general.name' \(#4\)"))
    cases.append(("empty key", build_gguf([("", U8, 1)], []).data, r"metadata #0 has an empty key"))
    cases.append(("alignment 3", build_gguf([("general.alignment", U32, 3)], []).data,
                  r"general.alignment 3 is not a power of two"))
    cases.append(("alignment type", build_gguf([("general.alignment", U8, 32)], []).data,
                  r"general.alignment has type uint8 \(expected uint32\)"))
    nest = (U8, [1])
    for _ in range(12):
        nest = (ARR, [nest])
    cases.append(("arrays nested too deep", build_gguf([("deep", ARR, nest[1], nest[0])], []).data,
                  r"metadata 'deep'\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]: arrays nested deeper than 8"))
    cases.append(("lone split", build_gguf([("split.count", U32, 2), ("split.no", U32, 1)], []).data,
                  r"file is split 2 of a 2-file split model; open the first split"))
    return cases


CASES = case_list()


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("label,data,pattern", CASES, ids=[c[0] for c in CASES])
def test_malformed(tmp_path, label, data, pattern):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    with pytest.raises(minfer.GGUFError, match=pattern) as e:
        minfer.gguf.open(p)
    assert str(p) in str(e.value), "the message must name the file"
    assert isinstance(e.value, minfer.MinferError)


def test_every_truncation_point(tmp_path):
    # Cut the file at every byte of its header and infos: always GGUFError, never a crash.
    d = base().data
    p = tmp_path / "cut.gguf"
    for n in range(0, base().offsets["data"] + 1):
        p.write_bytes(d[:n])
        with pytest.raises(minfer.GGUFError):
            minfer.gguf.open(p)


def test_random_byte_flips_never_crash(tmp_path):
    # Not a fuzzer (issue 8 brings one), but cheap insurance: flips either parse or raise GGUFError.
    rng = np.random.default_rng(7)
    d = bytearray(base().data)
    p = tmp_path / "flip.gguf"
    for _ in range(400):
        e = bytearray(d)
        for pos in rng.integers(0, base().offsets["data"], size=3):
            e[pos] = rng.integers(0, 256)
        p.write_bytes(bytes(e))
        try:
            f = minfer.gguf.open(p)
            f.metadata, [t.data for t in f.tensors.values()]
        except minfer.GGUFError:
            pass


def test_missing_and_directory(tmp_path):
    with pytest.raises(minfer.GGUFError, match=r"cannot open GGUF file '.*nope.gguf': No such file"):
        minfer.gguf.open(tmp_path / "nope.gguf")
    with pytest.raises(minfer.GGUFError, match="is not a regular file"):
        minfer.gguf.open(tmp_path)
