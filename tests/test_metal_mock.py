"""The Metal backend end to end on Linux: the real Objective-C++ host
(csrc/backends/metal/*.mm) and the real scheduler, on a mock
Metal device (tests/metal_mock/mock_metal.mm, GNUstep Foundation) whose
command buffers run the encoded dispatches through the MSL emulator.

A small qwen2 model (vocab 256, hidden 256, 2 layers, weights in six GGUF
types) is evaluated by a Metal session (tests/native/metal_forward.cpp): a
20-token prompt (simdgroup-matrix matmul and prefill attention), every
position's logits, then three decode steps (matvec, KV-split attention),
against a float64 numpy forward pass of the same file.  Then the same with RoPE and Add
moved to the CPU (MINFER_CPU_OPS): the plan alternates Metal and CPU
splits, and the logits match the all-Metal run."""
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import msl_harness as H
from gguf_writer import F32, STR, U32, build_gguf, f32_tensor
from logit_metrics import best_of
import minfer
from minfer.quants import dequantize, quantize

REPO = Path(__file__).resolve().parent.parent
GNUSTEP = Path("/usr/include/GNUstep/Foundation/Foundation.h")


def clang():
    for name in ("clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15", "clang++-14"):
        if shutil.which(name):
            return name
    pytest.skip("clang++ is not installed (CI installs clang-14: .ci/run)")


def build_driver() -> Path:
    """tests/native/metal_forward linked with csrc/ (Metal host, no CUDA), the mock device and its
    dispatch stub; cached under build/metal-mock by the content of everything it is made of."""
    cxx = clang()
    if not GNUSTEP.exists() or not Path("/usr/include/Block.h").exists():
        pytest.skip("GNUstep Foundation / BlocksRuntime headers are not installed (.ci/run installs them)")
    cpp = [p for p in sorted((REPO / "csrc").rglob("*.cpp"))
           if "python" not in p.parts and p.name not in ("metal_stub.cpp", "dot_neon.cpp", "attention_tiles_neon.cpp")]
    mm = sorted((REPO / "csrc/backends/metal").glob("*.mm")) + [REPO / "tests/metal_mock/mock_metal.mm"]
    extra = [REPO / "tests/metal_mock/dispatch_stub.cpp", REPO / "tests/native/metal_forward.cpp"]
    headers = sorted((REPO / "csrc").rglob("*.h")) + sorted((REPO / "csrc").rglob("*.inc")) + \
        sorted((REPO / "tests/metal_stub").rglob("*.h")) + [REPO / "tests/mslemu/msl_runtime.h", REPO / "metal/args.h"]
    h = hashlib.sha256()
    for p in cpp + mm + extra + headers:
        h.update(str(p).encode() + p.read_bytes())
    out = REPO / "build" / "metal-mock" / h.hexdigest()[:16]
    exe = out / "metal_forward"
    if exe.exists():
        return exe
    out.mkdir(parents=True, exist_ok=True)
    gcc_inc = subprocess.run(["gcc", "-print-file-name=include"], capture_output=True, text=True).stdout.strip()
    inc = ["-I", str(REPO / "csrc"), "-I", str(REPO / "metal"), "-I", str(REPO / "tests/metal_stub"),
           "-I", str(REPO / "tests/mslemu")]
    avx512 = ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
    isa = {"dot_avx2.cpp": ["-mavx2", "-mfma", "-mf16c"], "dot_avx512.cpp": avx512 + ["-mavx512vnni"],
           "attention_tiles_avx2.cpp": ["-mavx2", "-mfma", "-mf16c"], "attention_tiles_avx512.cpp": avx512}
    jobs = []
    for i, src in enumerate(cpp + extra):
        flags = isa.get(src.name, [])
        jobs.append(["g++", "-c", "-O1", "-std=c++17", "-fPIC", "-ffp-contract=off", "-DMINFER_HAVE_AVX2",
                     "-DMINFER_HAVE_AVX512", *inc, *flags, str(src), "-o", str(out / f"{i}_{src.stem}.o")])
    for j, src in enumerate(mm):
        jobs.append([cxx, "-c", "-O1", "-std=c++17", "-fPIC", "-x", "objective-c++", "-fblocks", "-fobjc-runtime=gcc",
                     "-fconstant-string-class=NSConstantString", "-Werror=objc-method-access", *inc,
                     "-I", "/usr/include/GNUstep", "-I", gcc_inc, str(src), "-o", str(out / f"mm{j}_{src.stem}.o")])

    def run(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(" ".join(cmd[-3:]) + "\n" + r.stderr[-4000:])

    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        list(ex.map(run, jobs))
    run([cxx, *sorted(str(p) for p in out.glob("*.o")), "-lgnustep-base", "-lobjc", "-lBlocksRuntime", "-ldl",
         "-lpthread", "-o", str(exe)])
    return exe


def tiny_qwen2(path: Path, rng, uniform: bool = False, arch: str = "qwen2") -> Path:
    """qwen2, vocab 256, hidden 256, 4 heads of 64 over 2 KV heads, ffn 512, 2 layers; matrices in
    Q8_0 / Q4_0 / Q5_0 / Q5_1 / Q4_1 (reference quantizers) and Q4_K / Q6_K (random valid blocks).
    uniform: q, k, v all Q4_K and gate, up both Q5_1, so the fused projections share one dispatch.
    arch "qwen3": the same with per-head q/k norms instead of the q/k/v biases."""
    V, E, H_, KV, HD, F, L = 256, 256, 4, 2, 64, 512, 2

    def quant(name, rows, cols, t):
        x = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        raw = np.stack([quantize(r, t) for r in x]).tobytes()
        return (name, t, [cols, rows], raw)

    def kquant(name, rows, cols, t):
        bb, off = {12: (144, [0, 2]), 14: (210, [208])}[t]
        raw = rng.integers(0, 256, size=(rows, cols // 256, bb), dtype=np.uint8)
        for o in off:
            raw[:, :, o:o + 2] = np.frombuffer(np.float16(2e-3 if t == 12 else 1e-3).tobytes(), np.uint8)
        return (name, t, [cols, rows], raw.tobytes())

    tensors = [quant("token_embd.weight", V, E, 8), f32_tensor("output_norm.weight", rng.uniform(0.8, 1.2, E))]
    for l in range(L):
        p = f"blk.{l}."
        tensors += [
            f32_tensor(p + "attn_norm.weight", rng.uniform(0.8, 1.2, E)),
            kquant(p + "attn_q.weight", H_ * HD, E, 12),
            kquant(p + "attn_k.weight", KV * HD, E, 12) if uniform else quant(p + "attn_k.weight", KV * HD, E, 2),
            kquant(p + "attn_v.weight", KV * HD, E, 12 if uniform else 14),
            quant(p + "attn_output.weight", E, H_ * HD, 6),
        ]
        if arch == "qwen3":
            tensors += [f32_tensor(p + "attn_q_norm.weight", rng.uniform(0.8, 1.2, HD)),
                        f32_tensor(p + "attn_k_norm.weight", rng.uniform(0.8, 1.2, HD))]
        else:
            tensors += [f32_tensor(p + "attn_q.bias", rng.standard_normal(H_ * HD) * 0.1),
                        f32_tensor(p + "attn_k.bias", rng.standard_normal(KV * HD) * 0.1),
                        f32_tensor(p + "attn_v.bias", rng.standard_normal(KV * HD) * 0.1)]
        tensors += [
            f32_tensor(p + "ffn_norm.weight", rng.uniform(0.8, 1.2, E)),
            quant(p + "ffn_gate.weight", F, E, 7), quant(p + "ffn_up.weight", F, E, 7 if uniform else 3),
            kquant(p + "ffn_down.weight", E, F, 14),
        ]
    a = arch
    kv = [("general.architecture", STR, a), (f"{a}.block_count", U32, L), (f"{a}.embedding_length", U32, E),
          (f"{a}.feed_forward_length", U32, F), (f"{a}.attention.head_count", U32, H_),
          (f"{a}.attention.head_count_kv", U32, KV), (f"{a}.attention.layer_norm_rms_epsilon", F32, 1e-6),
          (f"{a}.context_length", U32, 2048), (f"{a}.rope.freq_base", F32, 10000.0)]
    path.write_bytes(build_gguf(kv, tensors).data)
    return path


def forward64(path, tokens):
    """The model in float64 numpy, from the GGUF (an independent reference); k and v are rounded to
    f16 as the session's default KV cache stores them."""
    f = minfer.gguf.open(path)
    md = f.metadata
    L, E = md["qwen2.block_count"], md["qwen2.embedding_length"]
    H, KV = md["qwen2.attention.head_count"], md["qwen2.attention.head_count_kv"]
    HD, eps, base = E // H, md["qwen2.attention.layer_norm_rms_epsilon"], md["qwen2.rope.freq_base"]
    def W(name):
        t = f.tensors[name]
        return dequantize(t.data, t.type).reshape(t.shape).astype(np.float64)
    def norm(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    n = len(tokens); pos = np.arange(n)
    x = W("token_embd.weight")[tokens]
    half = HD // 2
    th = pos[:, None] * base ** (-2.0 * np.arange(half) / HD)
    def rope(v):  # [n, heads, HD], neox
        a, b = v[..., :half], v[..., half:]
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)
    for l in range(L):
        p = f"blk.{l}."
        h = norm(x, W(p + "attn_norm.weight"))
        q = (h @ W(p + "attn_q.weight").T + W(p + "attn_q.bias")).reshape(n, H, HD)
        k = (h @ W(p + "attn_k.weight").T + W(p + "attn_k.bias")).reshape(n, KV, HD)
        v = (h @ W(p + "attn_v.weight").T + W(p + "attn_v.bias")).reshape(n, KV, HD)
        q, k = rope(q), rope(k)
        k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        o = np.zeros((n, H, HD))
        for hh in range(H):
            g = hh // (H // KV)
            s = q[:, hh] @ k[:, g].T / np.sqrt(HD)
            s = np.where(np.tril(np.ones((n, n))) > 0, s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True)); pr /= pr.sum(-1, keepdims=True)
            o[:, hh] = pr @ v[:, g]
        x = x + o.reshape(n, E) @ W(p + "attn_output.weight").T
        h = norm(x, W(p + "ffn_norm.weight"))
        gt = h @ W(p + "ffn_gate.weight").T
        x = x + ((gt / (1 + np.exp(-gt))) * (h @ W(p + "ffn_up.weight").T)) @ W(p + "ffn_down.weight").T
    return norm(x, W("output_norm.weight")) @ W("token_embd.weight").T


def run_driver(exe: Path, model: Path, *forced: str, **env) -> dict:
    """Runs the driver; `forced` are kernel choices ("metal.attention=flash"), `env` settings and dump paths."""
    e = dict(os.environ, MSL_KERNELS_LIB=str(H.kernels().lib._name), MINFER_GPU_TIMEOUT_S="600", **env)
    r = subprocess.run([str(exe), str(model), *forced], capture_output=True, text=True, env=e, timeout=900)
    lines = r.stdout.strip().splitlines()
    m = re.match(r"max_abs_diff (\S+) scale (\S+) splits (\d+) greedy (\d+)", lines[-1] if lines else "")
    assert r.returncode == 0 and m and lines[-2].startswith("ops "), (r.stdout[-2000:], r.stderr[-3000:])
    ops = {k: int(v) for k, v in (item.split("=") for item in lines[-2].split()[1:])}
    return dict(diff=float(m[1]), scale=float(m[2]), splits=int(m[3]), greedy=int(m[4]), ops=ops)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    exe = build_driver()
    model = tiny_qwen2(tmp_path_factory.mktemp("mock") / "tiny.gguf", np.random.default_rng(7))
    return exe, model


TOKENS = [1, 17, 42, 5, 99, 23, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21,  # metal_forward's prompt,
          3, 200, 64]                                                                # then its decode tokens


def test_forward_pass_on_the_mock_device(setup, tmp_path):
    """Against the float64 reference (with the f16 KV cache modelled), Metal differs only by f32
    arithmetic and the few k/v values whose f16 rounding flips: 1e-3 of the logits' scale.  (The CPU
    session differs by ~8 % on this random model: its 8-bit activation blocks; not what is tested here.)"""
    exe, model = setup
    r = run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "metal.f32"))
    assert r["splits"] == 1, "every op of the decode graph runs on Metal"
    ref = forward64(str(model), TOKENS)
    got = np.fromfile(tmp_path / "metal.f32", np.float32).reshape(ref.shape)
    assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max(), np.abs(got - ref).max()


@pytest.mark.parametrize("uniform", [False, True], ids=["mixed-types", "one-type"])
def test_decode_fusions_on_the_mock_device(setup, tmp_path, uniform):
    """Metal runs the fused graph: each residual add with the norm after it, q|k|v one node (one dispatch when the three share a type, one per
    type otherwise), gate/up + SwiGLU one node (one dispatch when they share a type, else gate, up and
    SwiGLU), RoPE + KV store one kernel -- in the prompt (GEMM tier) and in decode (matvec tier).  Fused
    and unfused runs both stay within the forward test's bound of the float64 model."""
    exe, model = setup
    if uniform:
        model = tiny_qwen2(tmp_path / "uniform.gguf", np.random.default_rng(8), uniform=True)
    fused = run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "fused.f32"),
                       MOCK_METAL_TRACE=str(tmp_path / "fused.trace"))
    plain = run_driver(exe, model, METAL_FORWARD_FUSE="0", METAL_FORWARD_DUMP=str(tmp_path / "plain.f32"),
                       MOCK_METAL_TRACE=str(tmp_path / "plain.trace"))
    ops = fused["ops"]
    assert ops.get("FusedQKV") == 2 and ops.get("FusedFFN") == 2 and ops.get("RopeKvStore") == 2, ops
    # every residual add meets the norm after it, but the first layer's attn_norm (it reads the embedding)
    assert ops.get("AddRmsNorm") == 4 and ops.get("RmsNorm") == 1 and "Add" not in ops, ops
    assert "Rope" not in ops and "KvStore" not in ops and "Silu" not in ops, ops
    assert "FusedQKV" not in plain["ops"] and plain["ops"].get("KvStore") == 2, plain["ops"]
    # the first decode step's command buffer (the prompt's is the first line)
    step = {name: (tmp_path / f"{name}.trace").read_text().splitlines()[1].split() for name in ("fused", "plain")}
    # per layer one Q4_K dispatch: q|k|v together (one type), or q alone (k and v have other types)
    assert step["fused"].count("matvec_q4_K") == 2 and step["fused"].count("rope_kv_store") == 2, step["fused"]
    assert step["fused"].count("matvec_q5_1") == 2 and "rope" not in step["fused"] and "kv_store" not in step["fused"]
    # per layer: rope, rope, kv_store -> 1, silu, mul -> swiglu and two add + rms_norm pairs -> 1 each;
    # with one type also q, k, v -> 1 and gate, up, swiglu -> 1 (biases ride in the matvec either way)
    saved = 2 * (3 + 2 + (2 + 2 if uniform else 0))
    assert len(step["plain"]) - len(step["fused"]) == saved, (len(step["fused"]), len(step["plain"]))
    ref = forward64(str(model), TOKENS)
    for name in ("fused", "plain"):
        got = np.fromfile(tmp_path / f"{name}.f32", np.float32).reshape(ref.shape)
        assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max(), (name, np.abs(got - ref).max())


def test_qwen3_norm_fusion_on_the_mock_device(setup, tmp_path):
    """qwen3's per-head q/k norms ride in the fused projection (FusedQkvNorm: the q|k|v matvec, then
    rms_norm in place on the q and k windows): the same logits as the unfused graph, to f32 rounding."""
    exe, _ = setup
    model = tiny_qwen2(tmp_path / "qwen3.gguf", np.random.default_rng(9), uniform=True, arch="qwen3")
    fused = run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "fused.f32"))
    plain = run_driver(exe, model, METAL_FORWARD_FUSE="0", METAL_FORWARD_DUMP=str(tmp_path / "plain.f32"))
    assert fused["ops"].get("FusedQkvNorm") == 2 and "QkNorm" not in fused["ops"], fused["ops"]
    assert plain["ops"].get("QkNorm") == 4, plain["ops"]
    a, b = np.fromfile(tmp_path / "fused.f32", np.float32), np.fromfile(tmp_path / "plain.f32", np.float32)
    assert a.size == len(TOKENS) * 256 and np.all(np.isfinite(a))
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), np.abs(a - b).max()


def test_gemma3_on_the_mock_device(setup, tmp_path):
    """The tiny gemma3 (tests/tiny_models.py: sliding-window layers of 16 positions, linear RoPE scaling on the
    global one, GELU gate, sandwich norms, softcap) runs wholly on Metal -- one split, windowed attention
    included -- and matches its float64 forward (positions up to 22: the window cuts from position 16 on)."""
    import subprocess
    import sys

    from tiny_models import gemma3_forward_f64

    exe, _ = setup
    model = tmp_path / "gemma3.gguf"
    subprocess.run([sys.executable, str(REPO / "tests" / "tiny_models.py"), "gemma3-q8_0", str(model)], check=True)
    r = run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "metal.f32"))
    assert r["splits"] == 1 and r["ops"].get("Attn") == 6 and r["ops"].get("SoftCap") == 1, r
    ref = gemma3_forward_f64(str(model), TOKENS)
    got = np.fromfile(tmp_path / "metal.f32", np.float32).reshape(ref.shape)
    assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max(), np.abs(got - ref).max()


def test_batch_steps_on_the_mock_device(setup, tmp_path):
    """A Metal BatchRunner: every op of the step on Metal -- the paged KV pool in a Metal buffer, RoPE with the
    store at each token's pool row (rope_kv_store), attention_paged through the block tables (the first
    sequence's blocks 3 and 0, out of order), each sequence's last row picked -- two sequences of a ragged prompt
    step then a decode step each against the float64 model of each sequence alone; the decode step's 5 best a row (step_best: the logits read
    back, then a scan) are numpy's top-5 of its logits."""
    exe, model = setup
    e = dict(os.environ, MSL_KERNELS_LIB=str(H.kernels().lib._name), MINFER_GPU_TIMEOUT_S="600",
             METAL_FORWARD_BATCH=str(tmp_path / "batch.f32"))
    r = subprocess.run([str(exe), str(model)], capture_output=True, text=True, env=e, timeout=900)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines and lines[-1] == "batch ok", (r.stdout[-2000:], r.stderr[-3000:])
    place = dict(item.split("=") for item in lines[-2].split()[1:])
    assert all(where == "metal" for where in place.values()), place
    # RoPE of q and k with the store at the pool rows: one kernel, as in decode
    assert {"RopeKvStore", "Attn", "PickRows", "FusedQKV", "FusedFFN", "MatMul"} <= set(place), place
    assert "Rope" not in place and "KvStore" not in place, place
    got = np.fromfile(tmp_path / "batch.f32", np.float32).reshape(4, -1)
    a, b = TOKENS[:8], [9, 10, 11, 12, 13]
    for row, toks in zip(got, (a, b, a + [3], b + [200])):
        ref = forward64(str(model), toks)[-1]
        assert np.abs(row - ref).max() <= 1e-3 * np.abs(ref).max(), (toks, np.abs(row - ref).max())
    best = np.fromfile(tmp_path / "batch.f32.best", np.float32)  # the decode step's 5 best a row (step_best)
    vals, ids = best[:10].reshape(2, 5), best[10:].view(np.int32).reshape(2, 5)
    want_vals, want_ids = best_of(got[2:], 5)
    assert np.array_equal(ids, want_ids) and np.array_equal(vals, want_vals), (ids, want_ids)


def test_mixed_metal_cpu_splits(setup, tmp_path):
    exe, model = setup
    run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "metal.f32"))
    mixed = run_driver(exe, model, MINFER_CPU_OPS="Rope,Add", METAL_FORWARD_DUMP=str(tmp_path / "mixed.f32"))
    assert mixed["splits"] > 4, mixed  # Metal and CPU alternate within every layer
    a, b = np.fromfile(tmp_path / "metal.f32", np.float32), np.fromfile(tmp_path / "mixed.f32", np.float32)
    assert a.size == b.size == len(TOKENS) * 256
    # the CPU's RoPE takes its angle in double, Metal's in f32 (metal/rope.metal); Add is exact on both
    assert np.abs(a - b).max() <= 1e-3 * np.abs(a).max()


def test_attention_variants_agree(setup, tmp_path):
    """Decode attention over the 1024-position cache: the KV-split variant (the default, 2 splits) and
    the single-pass flash kernel (kernel choice metal.attention=flash) give the same logits to f32 rounding."""
    exe, model = setup
    run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "split.f32"))
    run_driver(exe, model, "metal.attention=flash", METAL_FORWARD_DUMP=str(tmp_path / "flash.f32"))
    a, b = np.fromfile(tmp_path / "split.f32", np.float32), np.fromfile(tmp_path / "flash.f32", np.float32)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()


@pytest.mark.parametrize("tier", ["matvec", "rows", "simdgroup"])
def test_matmul_tiers_agree(setup, tmp_path, tier):
    """The kernel choice metal.matmul forces one matmul tier for every row count: the single-token
    tier (one activation row per threadgroup row), the small-batch tier (groups of 8 rows, even for one
    row), or the simdgroup-matrix tier even for one row.  The forced run computes
    differently (other summation orders) and stays within the forward test's bound of the float64 model."""
    exe, model = setup
    run_driver(exe, model, METAL_FORWARD_DUMP=str(tmp_path / "auto.f32"))
    run_driver(exe, model, f"metal.matmul={tier}", METAL_FORWARD_DUMP=str(tmp_path / "forced.f32"))
    ref = forward64(str(model), TOKENS)
    a = np.fromfile(tmp_path / "auto.f32", np.float32).reshape(ref.shape)
    b = np.fromfile(tmp_path / "forced.f32", np.float32).reshape(ref.shape)
    assert not np.array_equal(a, b), "the switch changed nothing"
    assert np.abs(b - ref).max() <= 1e-3 * np.abs(ref).max(), np.abs(b - ref).max()


@pytest.mark.parametrize("arg,var,value,message", [
    (None, "MINFER_CPU_OPS", "Rope,Rop", "MINFER_CPU_OPS='Rope,Rop': unknown op 'Rop'"),
    (None, "MINFER_GPU_TIMEOUT_S", "soon", "MINFER_GPU_TIMEOUT_S='soon': must be a positive number of seconds"),
    ("metal.matmul=gemm", None, None, "kernel choice metal.matmul='gemm': must be auto or one of matvec, rows, simdgroup"),
    ("metal.attention=paged", None, None, "kernel choice metal.attention='paged': must be auto or one of flash, split"),
])
def test_bad_settings_and_choices_are_errors(setup, arg, var, value, message):
    exe, model = setup
    env = dict(os.environ, MSL_KERNELS_LIB=str(H.kernels().lib._name), **({var: value} if var else {}))
    r = subprocess.run([str(exe), str(model), *([arg] if arg else [])], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 1 and message in r.stdout, (r.stdout, r.stderr[-1000:])
