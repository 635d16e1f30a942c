"""compute-sanitizer (memcheck and racecheck) over the CUDA kernels: a decode step of a tiny model (kernel by
kernel, then captured and replayed), the f16 decode attention kernels of the real head sizes, and a batch
step's kernels.  Needs an NVIDIA GPU and compute-sanitizer; skips, saying why, elsewhere."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import synthetic_model
from cuda_cases import _gpu  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu

STEP = r'''
import sys, numpy as np
import minfer._minfer as M
s = M.Session(M.Model(sys.argv[1]), threads=2, n_ctx=64, device="cuda")
s.eval(np.arange(5, dtype=np.int32), 0)
for p in range(5, 8):   # first decode step runs kernel by kernel, the next ones are captured and replayed
    s.eval(np.array([p], np.int32), p)
print("done")
'''


# The tiny model's heads (32 dims) never take the f16 decode attention kernels of the real layouts: these run
# them on their own -- head_dim 128 and 64, the tensor-core group kernel, the warp kernels' cluster merge (8
# splits, some with no positions) and split grid with the combine, the position in the middle of a warp's
# rows -- as test_cuda_attention.decode_attention_case does.
ATTENTION = r'''
import sys, numpy as np
import minfer._minfer as M
s = M.Session(M.Model(sys.argv[1]), threads=2, n_ctx=64, device="cuda")
rng = np.random.default_rng(0)
for head_dim in (128, 64):
    for kernel, merge in (("auto", "auto"), ("warp", "cluster"), ("warp", "combine")):
        M.force_kernel("cuda.attention", kernel)
        M.force_kernel("cuda.attention_merge", merge)
        first, n_head, n_kv = 700, 12, 2
        q = rng.standard_normal((1, n_head * head_dim)).astype(np.float32)
        k = rng.standard_normal((first + 1, n_kv * head_dim)).astype(np.float32)
        v = rng.standard_normal((first + 1, n_kv * head_dim)).astype(np.float32)
        pos = np.arange(first + 1, dtype=np.int32).reshape(-1, 1)
        meta = dict(n_head=n_head, n_head_kv=n_kv, head_dim=head_dim, kv_type="f16",
                    n_ctx=8448 if kernel == "auto" else 1024,  # the tensor-core kernel's caches: > 8,192
                    attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
        nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=first + 1, cols=1, meta=meta),
                 dict(op="Attn", inputs=[0, 4, 5], rows=1, cols=n_head * head_dim, meta=meta)]
        out = s.run_ops("cuda", [q, k, v, pos, pos[-1:]], nodes)[-1]
        assert np.all(np.isfinite(out))
print("done")
'''


# A batch step's kernels: two ragged steps of the tiny Q8_0 model (its products on the bf16 and int8 tensor
# cores, the paged attention, the rows picked for the logits), a sampled step's top-k, a greedy one's argmax
# rows, the bf16 and int8 products of the real layouts' types (split K summed by the last block, rows past N
# and M), and the paged decode attention of the real head sizes: the tensor-core kernel, and the warp kernels
# with a block per query head and per KV head.
BATCH = r'''
import sys, numpy as np
import minfer._minfer as M
rng = np.random.default_rng(0)
r = M.BatchRunner(M.Model(sys.argv[1]), n_ctx=128, threads=2, kv_tokens=512, block_size=32, device="cuda")
tables = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
r.step(np.arange(20, dtype=np.int32), np.array(list(range(9)) + list(range(11)), np.int32),
       np.array([9, 11], np.int32), tables)
r.step(np.array([3, 4], np.int32), np.array([9, 11], np.int32), np.array([1, 1], np.int32), tables)
r.step_best(np.array([5, 6], np.int32), np.array([10, 12], np.int32), np.array([1, 1], np.int32), tables, k=40)
r.step_greedy(np.array([7, 8], np.int32), np.array([11, 13], np.int32), np.array([1, 1], np.int32), tables)
assert not M.cuda_argmax(rng.standard_normal((30, 152064)).astype(np.float32))[1]  # two launches of rows
x = np.round(rng.standard_normal((3, 9000)) * 2).astype(np.float32)  # ties; a last segment shorter than k
assert not M.cuda_top_k(x, 256)[2]
for t, bv, bb, n, k in ((12, 256, 144, 1003, 2048), (14, 256, 210, 77, 3584), (8, 32, 34, 200, 896),
                        (8, 32, 34, 200, 1280)):
    w = rng.integers(0, 256, size=(n, k // bv * bb), dtype=np.uint8)
    blocks = w.reshape(n, k // bv, bb)  # the f16 scales (d, and Q4_K's dmin) finite
    for at in ((208,) if t == 14 else (0, 2) if t == 12 else (0,)):
        blocks[:, :, at:at + 2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    for rows, path in ((5, "mma"), (64, "mma"), (5, "bf16"), (64, "bf16")):
        y, _ = M.cuda_matmul(t, w, rng.standard_normal((rows, k)).astype(np.float32), n, path=path)
        assert np.all(np.isfinite(y))
s = M.Session(M.Model(sys.argv[1]), threads=2, n_ctx=64, device="cuda")
for head_dim in (128, 64):
    for kernel, group in (("auto", "auto"), ("warp", "1"), ("warp", "all")):
        M.force_kernel("cuda.attention", kernel)
        M.force_kernel("cuda.attention_group", group)
        n_head, n_kv, n = 8, 2, 70
        meta = dict(n_head=n_head, n_head_kv=n_kv, head_dim=head_dim, kv_type="f16", n_ctx=256,
                    attn_scale=float(1 / np.sqrt(head_dim)), layer=0, block_size=32)
        q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
        k = rng.standard_normal((n, n_kv * head_dim)).astype(np.float32)
        v = rng.standard_normal((n, n_kv * head_dim)).astype(np.float32)
        pos = np.array([[i] for i in range(40)] + [[i] for i in range(30)], np.int32)
        seq = np.array([[0]] * 40 + [[1]] * 30, np.int32)
        tb = np.array([[5, 2, 7, 0], [1, 3, 4, 6]], np.int32)
        slots = np.array([[tb[s_, p // 32] * 32 + p % 32] for (s_,), (p,) in zip(seq, pos)], np.int32)
        nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=n, cols=1, meta=meta),
                 dict(op="Attn", inputs=[0, 4, 7, 5, 6], rows=n, cols=n_head * head_dim, meta=meta)]
        out = s.run_ops("cuda", [q, k, v, slots, pos, seq, tb], nodes)[-1]
        assert np.all(np.isfinite(out))
print("done")
'''


@pytest.mark.parametrize("what", ["step", "attention", "batch"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_decode_step(tool, what, tmp_path):
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(exe):
        pytest.skip("compute-sanitizer is not installed")
    script = tmp_path / "step.py"
    script.write_text({"step": STEP, "attention": ATTENTION, "batch": BATCH}[what])
    model = synthetic_model("qwen2-tiny-q8_0" if what == "batch" else "qwen2-tiny-q4_0")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([exe, "--tool", tool, "--error-exitcode", "3", sys.executable, str(script), str(model)],
                       capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "done" in out, out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-3000:]
