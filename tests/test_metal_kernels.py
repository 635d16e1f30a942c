"""Rung 1 for the Metal backend's kernels, on Linux (the attention kernels: test_metal_attention.py): every
metal/*.metal kernel compiled as C++ by the MSL emulator (tests/mslemu: threadgroups as fibers,
barriers and SIMD collectives as the only switch points, seeded random thread
order) and checked against float64 numpy at real model widths (few rows: the
emulator runs ~100k threads a second).  Then the emulator itself: the bugs it
exists to catch (a missing barrier, a barrier in divergent code, an early
return before a barrier, threadgroup arrays declared in a kernel) are caught.

What this cannot show -- Apple's compiler accepting the source, real GPU
numerics and limits, speed -- is listed in metal/README.md."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import msl_harness as H
from msl_harness import k, pack  # noqa: F401 (k: the emulated kernels, a fixture)
from minfer.quants import dequantize

U = 2.0 ** -24
REPO = Path(__file__).resolve().parent.parent
TYPES = {  # name: (ggml id, values per block, bytes per block, f16 scale offsets, typical scale)
    "f32": (0, 1, 4, [], 0), "f16": (1, 1, 2, [], 0),
    "q4_0": (2, 32, 18, [0], 5e-3), "q4_1": (3, 32, 20, [0, 2], 3e-3), "q5_0": (6, 32, 22, [0], 2.5e-3),
    "q5_1": (7, 32, 24, [0, 2], 1.5e-3), "q8_0": (8, 32, 34, [0], 3e-4), "q4_K": (12, 256, 144, [0, 2], 1e-3),
    "q5_K": (13, 256, 176, [0, 2], 5e-4), "q6_K": (14, 256, 210, [208], 2e-4),
}


def random_weight(name, n, kk, rng):
    t, bv, bb, f16s, scale = TYPES[name]
    if name == "f32":
        return t, (rng.standard_normal((n, kk)) * 0.02).astype(np.float32).view(np.uint8).copy()
    if name == "f16":
        return t, (rng.standard_normal((n, kk)) * 0.02).astype(np.float16).view(np.uint8).copy()
    raw = rng.integers(0, 256, size=(n, kk // bv, bb), dtype=np.uint8)
    for off in f16s:
        s = (rng.uniform(0.5, 1.5, size=(n, kk // bv)) * scale).astype(np.float16)
        raw[:, :, off:off + 2] = s.view(np.uint8).reshape(n, kk // bv, 2)
    return t, raw.reshape(n, -1)


# ---- norms, elementwise, rope -------------------------------------------------------------------

@pytest.mark.parametrize("width,cols,threads", [(1536, 1536, 256), (896, 896, 128), (128, 1536, 32), (64, 256, 32)])
def test_rms_norm(k, rng, width, cols, threads):
    rows = 3
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, width).astype(np.float32)
    y = np.full((rows, cols), np.nan, np.float32)
    k.dispatch("rms_norm", {0: pack("IIIf", width, cols, cols, 1e-6), 1: x, 2: w, 3: y},
               grid=(rows, cols // width, 1), tg=(threads, 1, 1), tg_bytes={0: 4 * threads // 32})
    g = x.astype(np.float64).reshape(rows, cols // width, width)
    ref = (g / np.sqrt((g * g).mean(-1, keepdims=True) + 1e-6) * w).reshape(rows, cols)
    assert np.abs(y - ref).max() <= 16 * U * np.abs(ref).max()


@pytest.mark.parametrize("width,threads", [(1536, 256), (896, 128)])
def test_add_rms_norm(k, rng, width, threads):
    """The residual add fused with the next norm: the sum exact (one f32 addition), the norm within the
    rms_norm bound; a and b read through row strides wider than the row, as the graph's windows are."""
    rows = 3
    a = (rng.standard_normal((rows, 2 * width)) * 3).astype(np.float32)  # the sum window of a fused output
    b = rng.standard_normal((rows, width)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, width).astype(np.float32)
    y = np.full((rows, 2 * width), np.nan, np.float32)
    k.dispatch("add_rms_norm", {0: pack("IIIIf", width, 2 * width, width, 2 * width, 1e-6), 1: a, 2: b, 3: w, 4: y},
               grid=(rows, 1, 1), tg=(threads, 1, 1), tg_bytes={0: 4 * threads // 32})
    s = a[:, :width] + b
    assert np.array_equal(y[:, :width], s)
    s64 = s.astype(np.float64)
    ref = s64 / np.sqrt((s64 * s64).mean(-1, keepdims=True) + 1e-6) * w
    assert np.abs(y[:, width:] - ref).max() <= 16 * U * np.abs(ref).max()


@pytest.mark.parametrize("op", range(9), ids=["add", "mul", "silu", "swiglu", "copy", "gelu", "geglu", "scale", "softcap"])
def test_elementwise(k, rng, op):
    """Each op within 4 f32 ulps of float64 at the output's scale (softcap at 30 over inputs up to ~150)."""
    rows, cols = 2, 8960
    a = (rng.standard_normal((rows, cols)) * (40 if op == 8 else 4)).astype(np.float32)
    b = rng.standard_normal((rows, cols)).astype(np.float32)
    y = np.full((rows, cols), np.nan, np.float32)
    scale = {7: float(np.sqrt(np.float32(640))), 8: 30.0}.get(op, 1.0)
    k.dispatch("elementwise", {0: pack("IIIIIf", cols, cols, cols, cols, op, scale), 1: a, 2: b, 3: y},
               grid=((cols + 255) // 256, rows, 1), tg=(256, 1, 1))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    silu = a64 / (1 + np.exp(-a64))
    gelu = 0.5 * a64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (a64 + 0.044715 * a64 ** 3)))
    ref = [a64 + b64, a64 * b64, silu, silu * b64, a64, gelu, gelu * b64, a64 * scale, scale * np.tanh(a64 / scale)][op]
    assert np.abs(y - ref).max() <= 4 * U * np.abs(ref).max()


@pytest.mark.parametrize("neox,head_dim,rope_dim", [(True, 128, 128), (False, 64, 64), (True, 64, 32)])
def test_rope(k, rng, neox, head_dim, rope_dim):
    rows, heads, base = 5, 12, 1e6
    cols = heads * head_dim
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    pos = rng.integers(0, 4096, size=rows).astype(np.int32)
    freq64 = base ** (-2.0 * np.arange(rope_dim // 2) / rope_dim)
    y = np.full((rows, cols), np.nan, np.float32)
    k.dispatch("rope", {0: pack("IIIIII", cols, head_dim, rope_dim, cols, cols, int(neox)), 1: x, 2: pos,
                        3: freq64.astype(np.float32), 4: y}, grid=((cols // 2 + 63) // 64, rows, 1), tg=(64, 1, 1))
    ref = x.astype(np.float64).reshape(rows, heads, head_dim).copy()
    th = pos[:, None].astype(np.float64) * freq64[None, :]
    half = rope_dim // 2
    i0 = np.arange(half) if neox else 2 * np.arange(half)
    i1 = i0 + half if neox else i0 + 1
    x0, x1 = ref[:, :, i0].copy(), ref[:, :, i1].copy()
    c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    ref[:, :, i0], ref[:, :, i1] = x0 * c - x1 * s, x0 * s + x1 * c
    # the angle pos * float(freq) is rounded twice in f32 (freq, then the product): 2 ulp of the angle
    bound = (2 * 2.0 ** -23 * th.max() + 16 * U) * np.abs(x).max() * 2
    assert np.abs(y - ref.reshape(rows, cols)).max() <= bound
    assert np.array_equal(y.reshape(rows, heads, head_dim)[..., rope_dim:], x.reshape(rows, heads, head_dim)[..., rope_dim:])


# ---- weights: matvec and the embedding gather ------------------------------------------------------

def mv_args(kk, n, row_bytes, n_rows, end0=None, end1=None, w_off=(0, 0, 0), bias=None, swiglu=0):
    """MatvecArgs (metal/args.h): one part unless end0/end1 split the columns into q|k|v-like parts."""
    end0 = n if end0 is None else end0
    end1 = n if end1 is None else end1
    b = bias or (0, 0, 0)
    return pack("I" * 16, kk, n, row_bytes, kk, n, n_rows, end0, end1, *w_off, int(bias is not None), *b, swiglu)


def matvec_tier(k, name, wtype, args, bufs, n, n_rows):
    """Dispatch the single-token tier (grid.y = rows) or the small-batch tier (grid.y = groups of 8 rows)."""
    groups = n_rows if name == "matvec" else (n_rows + 7) // 8
    k.dispatch(f"{name}_{wtype}", {0: args, **bufs}, grid=((n + 3) // 4, groups, 1), tg=(128, 1, 1))


def f32_dot_bound(x, W):
    """f32 products summed in f32 over K terms: |error| <= 2 K u sum|x||w| (per output)."""
    return 2 * x.shape[1] * U * (np.abs(x).astype(np.float64) @ np.abs(W).T)


@pytest.mark.parametrize("tier,n_rows", [("matvec", 1), ("matvec", 3), ("matmul_rows", 3), ("matmul_rows", 11)])
@pytest.mark.parametrize("wtype,kk", [("q4_K", 1536), ("q6_K", 1536), ("q5_K", 2048), ("q5_0", 896), ("q8_0", 4864),
                                      ("q4_0", 896), ("q4_1", 576), ("q5_1", 1536), ("f16", 896), ("f32", 256)])
def test_matvec_tiers(k, rng, wtype, kk, tier, n_rows):
    n = 38  # output columns: 10 threadgroups of 4 simdgroups, the last one half empty
    t, w = random_weight(wtype, n, kk, rng)
    x = rng.standard_normal((n_rows, kk)).astype(np.float32)
    y = np.full((n_rows, n), np.nan, np.float32)
    matvec_tier(k, tier, wtype, mv_args(kk, n, w.shape[1], n_rows), {1: w, 2: x, 3: y, 4: x}, n, n_rows)
    W = dequantize(w, t).reshape(n, kk).astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    assert np.all(np.abs(y - ref) <= f32_dot_bound(x, W) + 1e-30), np.abs(y - ref).max()


@pytest.mark.parametrize("tier,n_rows", [("matvec", 1), ("matmul_rows", 9)])
@pytest.mark.parametrize("wtype", ["q4_K", "q8_0", "q5_0"])
def test_matvec_fused_parts(k, rng, wtype, tier, n_rows):
    """The fused decode projections: q|k|v parts of one type at byte offsets of one buffer, with their
    biases at float offsets of another (one dispatch), and gate/up with SwiGLU."""
    kk = 1536 if wtype == "q4_K" else 896
    sizes = (64, 16, 16)
    parts = [random_weight(wtype, m, kk, rng) for m in sizes]
    t, rb = parts[0][0], parts[0][1].shape[1]
    gap = 3 * rb  # unrelated bytes between the parts, as between tensors in a file; stored v, k, q (any order)
    blob = np.concatenate([np.concatenate([p[1].reshape(-1), rng.integers(0, 256, gap, dtype=np.uint8)])
                           for p in parts[::-1]])
    offs = np.cumsum([0] + [p[1].size + gap for p in parts[::-1]])[:3].tolist()[::-1]
    biases = [rng.standard_normal(m).astype(np.float32) for m in sizes]
    bias_buf = np.concatenate([np.zeros(5, np.float32), biases[0], np.zeros(3, np.float32), biases[1], biases[2]])
    b_offs = (5, 5 + 64 + 3, 5 + 64 + 3 + 16)
    x = rng.standard_normal((n_rows, kk)).astype(np.float32)
    n = sum(sizes)
    y = np.full((n_rows, n), np.nan, np.float32)
    args = mv_args(kk, n, rb, n_rows, end0=64, end1=80, w_off=tuple(offs), bias=b_offs)
    matvec_tier(k, tier, wtype, args, {1: blob, 2: x, 3: y, 4: bias_buf}, n, n_rows)
    Ws = [dequantize(p[1], t).reshape(m, kk).astype(np.float64) for p, m in zip(parts, sizes)]
    W = np.concatenate(Ws)
    ref = x.astype(np.float64) @ W.T + np.concatenate(biases)
    assert np.all(np.abs(y - ref) <= f32_dot_bound(x, W) + 4 * U * np.abs(ref) + 1e-30), np.abs(y - ref).max()

    # gate (part 0) and up (part 1) -> silu(gate) * up, 64 columns
    y = np.full((n_rows, 64), np.nan, np.float32)
    up = random_weight(wtype, 64, kk, rng)[1]
    blob2 = np.concatenate([up.reshape(-1), rng.integers(0, 256, gap, dtype=np.uint8), parts[0][1].reshape(-1)])
    args = mv_args(kk, 64, rb, n_rows, w_off=(up.size + gap, 0, 0), swiglu=1)  # gate after up in the buffer
    matvec_tier(k, tier, wtype, args, {1: blob2, 2: x, 3: y, 4: x}, 64, n_rows)
    Wu = dequantize(up, t).reshape(64, kk).astype(np.float64)
    g, u = x.astype(np.float64) @ Ws[0].T, x.astype(np.float64) @ Wu.T
    ref = g / (1 + np.exp(-g)) * u
    # silu'(g) <= 1.1: each product's error moves the output by at most 1.1 |u| eg + |silu(g)| eu, plus roundings
    eg, eu = f32_dot_bound(x, Ws[0]), f32_dot_bound(x, Wu)
    bound = 1.1 * np.abs(u) * eg + np.abs(g) * eu + eg * eu + 8 * U * np.abs(ref)
    assert np.all(np.abs(y - ref) <= bound + 1e-30), np.abs(y - ref).max()


@pytest.mark.parametrize("wtype,kk", [("q4_K", 512), ("q6_K", 256), ("q8_0", 896), ("q5_1", 576), ("f16", 128)])
def test_matmul_simdgroup_tier(k, rng, wtype, kk):
    m, n = 37, 72  # partial tiles in both directions: 2 x 2 threadgroups of a 32 x 64 tile
    t, w = random_weight(wtype, n, kk, rng)
    x = rng.standard_normal((m, kk)).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    k.dispatch(f"matmul_mm_{wtype}", {0: pack("IIIIII", kk, n, m, w.shape[1], kk, n), 1: w, 2: x, 3: y},
               grid=(2, 2, 1), tg=(128, 1, 1), tg_bytes={0: 64 * 32 * 4, 1: 32 * 32 * 4, 2: 32 * 64 * 4})
    W = dequantize(w, t).reshape(n, kk).astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    bound = 2 * kk * U * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert np.all(np.abs(y - ref) <= bound + 1e-30), np.abs(y - ref).max()


@pytest.mark.parametrize("wtype", ["q8_0", "q4_K", "q6_K", "q5_0", "f16"])
def test_get_rows_is_exact(k, rng, wtype):
    n, kk = 64, 896 if wtype != "q4_K" and wtype != "q6_K" else 1536
    t, w = random_weight(wtype, n, kk, rng)
    ids = np.array([5, 63, 0, 17], np.int32)
    y = np.full((4, kk), np.nan, np.float32)
    err = np.zeros(1, np.uint32)
    k.dispatch(f"get_rows_{wtype}", {0: pack("IIII", kk, w.shape[1], n, kk), 1: w, 2: ids, 3: y, 4: err},
               grid=((kk // 8 + 63) // 64, 4, 1), tg=(64, 1, 1))
    assert err[0] == 0
    assert np.array_equal(y, dequantize(w[ids], t).reshape(4, kk))  # bit-identical to the reference
    ids[1] = n  # out of range: zeros and the error word
    k.dispatch(f"get_rows_{wtype}", {0: pack("IIII", kk, w.shape[1], n, kk), 1: w, 2: ids, 3: y, 4: err},
               grid=((kk // 8 + 63) // 64, 4, 1), tg=(64, 1, 1))
    assert err[0] == 1 and not y[1].any()


def test_argmax(k, rng):
    for n, plant in ((151936, None), (151936, (5, 90000)), (1000, (0, 999))):
        x = rng.standard_normal(n).astype(np.float32)
        if plant:  # a tie between two positions: the first wins, as numpy's argmax
            x[list(plant)] = x.max() + 1
        out = np.full(1, -1, np.int32)
        k.dispatch("argmax", {0: pack("I", n), 1: x, 2: out}, grid=(1, 1, 1), tg=(1024, 1, 1),
                   tg_bytes={0: 128, 1: 128})
        assert out[0] == np.argmax(x)
    x = rng.standard_normal(151936).astype(np.float32)
    x[[7, 120000]] = [np.nan, x.max() + 1]  # a NaN is never the winner: the kernel answers -1 (the host raises)
    out = np.full(1, 5, np.int32)
    k.dispatch("argmax", {0: pack("I", 151936), 1: x, 2: out}, grid=(1, 1, 1), tg=(1024, 1, 1),
               tg_bytes={0: 128, 1: 128})
    assert out[0] == -1


def test_results_do_not_depend_on_thread_order(k, rng):
    """The kernels are deterministic whatever order the emulator runs threads in."""
    x = rng.standard_normal((2, 1536)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 1536).astype(np.float32)
    outs = []
    for seed in range(4):
        y = np.zeros((2, 1536), np.float32)
        k.dispatch("rms_norm", {0: pack("IIIf", 1536, 1536, 1536, 1e-6), 1: x, 2: w, 3: y}, grid=(2, 1, 1),
                   tg=(256, 1, 1), tg_bytes={0: 32}, seed=seed)
        outs.append(y)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_unbound_buffer_is_an_error(k, rng):
    with pytest.raises(H.MslError, match="buffer\\(2\\) \\(w\\) is not bound"):
        k.dispatch("rms_norm", {0: pack("IIIf", 64, 64, 64, 1e-6), 1: np.zeros(64, np.float32),
                                3: np.zeros(64, np.float32)}, grid=(1, 1, 1), tg=(32, 1, 1), tg_bytes={0: 4})
    with pytest.raises(H.MslError, match="shorter than its struct"):
        k.dispatch("rms_norm", {0: pack("I", 64), 1: np.zeros(64, np.float32), 2: np.zeros(64, np.float32),
                                3: np.zeros(64, np.float32)}, grid=(1, 1, 1), tg=(32, 1, 1), tg_bytes={0: 4})


# ---- the emulator catches what it exists to catch ----------------------------------------------------

BAD = r'''
#include <metal_stdlib>
using namespace metal;

// sums 64 values through threadgroup memory; `fence` = 0 leaves out the barrier
kernel void tg_sum(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                   constant uint& fence [[buffer(2)]], threadgroup float* t [[threadgroup(0)]],
                   uint tid [[thread_index_in_threadgroup]]) {
    t[tid] = x[tid] * 2.0f;
    if (fence) threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float s = 0.0f;
        for (uint i = 0; i < 64; i++) s += t[i];
        y[0] = s;
    }
}

kernel void divergent(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    if (tid < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
    else threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = 1.0f;
}

kernel void early_return(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    if (tid >= 60) return;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = 1.0f;
}
'''


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    p = tmp_path_factory.mktemp("msl") / "bad.metal"
    p.write_text(BAD)
    return H.build([p])


def test_a_missing_barrier_shows_under_some_thread_order(bad):
    x = np.arange(64, dtype=np.float32)
    results = set()
    for seed in range(8):
        y = np.zeros(1, np.float32)
        bad.dispatch("tg_sum", {0: x, 1: y, 2: pack("I", 0)}, grid=(1, 1, 1), tg=(64, 1, 1), tg_bytes={0: 256},
                     seed=seed)
        results.add(float(y[0]))
    assert results != {float(2 * x.sum())}, "without the barrier some order must read unwritten memory"
    y = np.zeros(1, np.float32)
    for seed in range(8):
        bad.dispatch("tg_sum", {0: x, 1: y, 2: pack("I", 1)}, grid=(1, 1, 1), tg=(64, 1, 1), tg_bytes={0: 256},
                     seed=seed)
        assert y[0] == 2 * x.sum()


def test_divergent_barrier_and_early_return_are_reported(bad):
    y = np.zeros(64, np.float32)
    with pytest.raises(H.MslError, match="divergent control flow"):
        bad.dispatch("divergent", {0: y}, grid=(1, 1, 1), tg=(64, 1, 1))
    with pytest.raises(H.MslError, match="returned before the barrier"):
        bad.dispatch("early_return", {0: y}, grid=(1, 1, 1), tg=(64, 1, 1))


def test_threadgroup_arrays_in_kernels_are_refused(tmp_path):
    p = tmp_path / "arr.metal"
    p.write_text("#include <metal_stdlib>\nusing namespace metal;\nkernel void f(device float* y [[buffer(0)]]) {\n"
                 "    threadgroup float t[32];\n    y[0] = t[0];\n}\n")
    with pytest.raises(H.MslError, match="threadgroup array declared"):
        H.build([p])


def test_sanitizer_build_runs_the_kernels_clean():
    """The ASan + UBSan build of the emulated kernels runs this file's kernel tests in a child
    process (libasan preloaded): no report, and the same results."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    if os.environ.get("MSL_SANITIZE") == "1":
        pytest.skip("already the sanitized run")
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan):
        pytest.skip("libasan is not installed")
    env = dict(os.environ, MSL_SANITIZE="1", LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                        "-k", "matvec or attention or rms_norm or get_rows", "-W", "ignore"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "ERROR: AddressSanitizer" not in out and "runtime error" not in out, out[-4000:]


OOB = r'''
#include <metal_stdlib>
using namespace metal;
kernel void oob(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    y[tid + 1] = 1.0f;
}
'''


def test_sanitizer_build_reports_an_out_of_bounds_store(tmp_path):
    """A store one past the end of a bound buffer, in the ASan build: reported, at its .metal line."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan):
        pytest.skip("libasan is not installed")
    src = tmp_path / "oob.metal"
    src.write_text(OOB)
    code = (f"import sys, numpy as np; sys.path.insert(0, {str(REPO / 'tests')!r}); import msl_harness as H;"
            f"k = H.build([__import__('pathlib').Path({str(src)!r})], sanitize=True);"
            "k.dispatch('oob', {0: np.zeros(32, np.float32)}, grid=(1, 1, 1), tg=(32, 1, 1))")
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0", PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "heap-buffer-overflow" in r.stderr and "oob.metal:5" in r.stderr, r.stderr[-3000:]
