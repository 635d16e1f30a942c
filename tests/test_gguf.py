"""The GGUF reader: metadata of every value type, tensor infos and zero-copy
views, alignment, split models; checked against the `gguf` package's reader
and against files written by an independent writer."""
import struct

import numpy as np
import pytest

import minfer
from gguf_writer import ARR, BOOL, F32, F64, I8, I16, I32, I64, STR, U8, U16, U32, U64, build_gguf, f32_tensor

gguf = pytest.importorskip("gguf", reason="the PyPI `gguf` package is the independent oracle")


def write(tmp_path, built, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(built.data if hasattr(built, "data") else built)
    return p


ALL_KV = [
    ("general.architecture", STR, "llama"),
    ("t.u8", U8, 250), ("t.i8", I8, -100), ("t.u16", U16, 65000), ("t.i16", I16, -30000),
    ("t.u32", U32, 4_000_000_000), ("t.i32", I32, -2_000_000_000), ("t.f32", F32, 0.25),
    ("t.bool", BOOL, True), ("t.str", STR, "héllo ✓"), ("t.u64", U64, 2**63 + 5), ("t.i64", I64, -2**62),
    ("t.f64", F64, 1e-300),
    ("t.arr_i32", ARR, [1, -2, 3], I32), ("t.arr_str", ARR, ["a", "", "ü"], STR),
    ("t.arr_f32", ARR, [0.5, -1.5], F32), ("t.arr_bool", ARR, [True, False], BOOL),
    ("t.arr_empty", ARR, [], U8),
    ("t.nested", ARR, [(I16, [1, 2]), (STR, ["x"]), (ARR, [(U8, [7])])], ARR),
]
EXPECTED = {
    "general.architecture": "llama", "t.u8": 250, "t.i8": -100, "t.u16": 65000, "t.i16": -30000,
    "t.u32": 4_000_000_000, "t.i32": -2_000_000_000, "t.f32": 0.25, "t.bool": True, "t.str": "héllo ✓",
    "t.u64": 2**63 + 5, "t.i64": -2**62, "t.f64": 1e-300, "t.arr_i32": [1, -2, 3], "t.arr_str": ["a", "", "ü"],
    "t.arr_f32": [0.5, -1.5], "t.arr_bool": [True, False], "t.arr_empty": [], "t.nested": [[1, 2], ["x"], [[7]]],
}


@pytest.mark.parametrize("version", [2, 3])
def test_every_value_type(tmp_path, version):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = write(tmp_path, build_gguf(ALL_KV, [f32_tensor("a", a)], version=version))
    f = minfer.gguf.open(p)
    assert f.version == version
    assert f.metadata == EXPECTED
    assert f.metadata_types["t.nested"] == "array[array]"
    assert list(f.metadata) == [k for k, *_ in ALL_KV]  # file order kept
    t = f.tensors["a"]
    assert t.shape == (3, 4) and t.type_name == "F32" and t.nbytes == 48
    assert np.array_equal(t.data, a)


def test_alignment_and_offsets(tmp_path):
    kv = [("general.alignment", U32, 64)]
    tensors = [f32_tensor("x", np.ones(3)), f32_tensor("y", np.arange(5)), f32_tensor("z", np.full((2, 2), 7))]
    built = build_gguf(kv, tensors, alignment=64)
    f = minfer.gguf.open(write(tmp_path, built))
    assert f.alignment == 64
    assert f._native.data_offset(0) == built.offsets["data"] and built.offsets["data"] % 64 == 0
    assert [f.tensors[n].offset for n in "xyz"] == [0, 64, 128]
    assert np.array_equal(f.tensors["y"].data, np.arange(5, dtype=np.float32))


def test_views_are_zero_copy_and_read_only(tmp_path):
    p = write(tmp_path, build_gguf([], [f32_tensor("w", np.arange(64).reshape(8, 8))]))
    f = minfer.gguf.open(p)
    v = f.tensors["w"].data
    assert not v.flags.writeable and not v.flags.owndata
    with pytest.raises(ValueError):
        v[0, 0] = 1
    f.close()
    del f
    assert v[7, 7] == 63  # the view keeps the mapping alive after close()


def test_matches_gguf_package_on_real_model(qwen05_path):
    ours = minfer.gguf.open(qwen05_path)
    theirs = gguf.GGUFReader(qwen05_path)
    meta = ours.metadata
    assert set(meta) == set(theirs.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                expect = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                expect = [field.parts[i].tolist()[0] for i in field.data]
            assert meta[key] == expect, key
        else:
            assert meta[key] == field.contents(), key
    assert len(ours.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        o = ours.tensors[t.name]
        assert o.type == int(t.tensor_type)
        assert o.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert o.nbytes == int(t.n_bytes)
        assert theirs.data_offset + o.offset == int(t.data_offset)
        assert np.array_equal(o.data.reshape(-1).view(np.uint8)[:4096], np.asarray(t.data).reshape(-1).view(np.uint8)[:4096])


def test_real_models_hyperparameters(smollm2_path, qwen05_path):
    s = minfer.gguf.open(smollm2_path).metadata
    assert s["general.architecture"] == "llama" and s["llama.block_count"] == 30
    assert s["llama.embedding_length"] == 576 and len(s["tokenizer.ggml.tokens"]) == 49152
    q = minfer.gguf.open(qwen05_path)
    assert q.metadata["qwen2.attention.head_count_kv"] == 2
    assert q.tensors["token_embd.weight"].shape == (151936, 896)


def split_files(tmp_path, n=3, tensors_per=2, count_meta=None, no_offset=0):
    paths = []
    total = n * tensors_per
    for i in range(n):
        kv = [("split.no", U16, i + no_offset), ("split.count", U16, n if count_meta is None else count_meta)]
        if i == 0:
            kv = [("general.architecture", STR, "llama"), ("split.tensors.count", I32, total)] + kv
        ts = [f32_tensor(f"t{i}_{k}", np.full(4, i * 10 + k)) for k in range(tensors_per)]
        paths.append(write(tmp_path, build_gguf(kv, ts), f"model-{i + 1:05d}-of-{n:05d}.gguf"))
    return paths


def test_split_model(tmp_path):
    paths = split_files(tmp_path)
    for p in paths:  # any split name opens the whole model
        f = minfer.gguf.open(p)
        assert len(f.paths) == 3 and len(f.tensors) == 6
        assert f.metadata["general.architecture"] == "llama"
        assert f.tensors["t2_1"].file == 2
        assert np.array_equal(f.tensors["t2_1"].data, np.full(4, 21, np.float32))


def test_split_model_errors(tmp_path):
    paths = split_files(tmp_path)
    paths[1].unlink()
    with pytest.raises(minfer.GGUFError, match=r"cannot open GGUF file '.*model-00002-of-00003.gguf'"):
        minfer.gguf.open(paths[0])
    (tmp_path / "b").mkdir()
    paths = split_files(tmp_path / "b", count_meta=4)
    with pytest.raises(minfer.GGUFError, match="split.count is 4 but the file name says 3 splits"):
        minfer.gguf.open(paths[0])
    (tmp_path / "c").mkdir()
    paths = split_files(tmp_path / "c", no_offset=1)
    with pytest.raises(minfer.GGUFError, match=r"split.no is 1 but the file name says split 0"):
        minfer.gguf.open(paths[0])
    # a shard renamed so that its name no longer says it is one
    one = tmp_path / "renamed.gguf"
    (tmp_path / "d").mkdir()
    shard = split_files(tmp_path / "d")[1]
    one.write_bytes(shard.read_bytes())
    with pytest.raises(minfer.GGUFError, match="split 2 of a 3-file split model"):
        minfer.gguf.open(one)
