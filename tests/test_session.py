"""The session: graph reuse, the context limit, bad input, plan inspection,
fusion, KV cache types, and the trace/profile settings."""
import os
import subprocess
import sys

import numpy as np
import pytest

import minfer
from conftest import nan_logits_model, synthetic_model
from logit_metrics import best_of

M = minfer._minfer


@pytest.fixture(scope="module")
def qwen2():
    return M.Model(str(synthetic_model("qwen2-tiny-q8_0")))


def test_decode_reuses_one_graph(qwen2):
    s = M.Session(qwen2, threads=2, n_ctx=128)
    prompt = np.arange(100, 116, dtype=np.int32)
    s.eval(prompt, 0)
    assert s.graph_builds == 1
    tok = 7
    for k in range(64):
        tok = int(s.eval(np.array([tok], np.int32), 16 + k)[0].argmax())
    assert s.graph_builds == 2, "a 64-token decode builds the decode graph once"


def test_eval_greedy_is_the_argmax_of_eval(qwen2):
    s = M.Session(qwen2, threads=2, n_ctx=64)
    prompt = np.arange(100, 109, dtype=np.int32)
    logits = s.eval(prompt, 0)
    assert s.eval_greedy(prompt, 0) == int(np.argmax(logits[-1]))
    tok = s.eval_greedy(np.array([3], np.int32), 9)
    assert tok == int(np.argmax(s.eval(np.array([3], np.int32), 9)[-1]))
    assert s.device == "cpu"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_eval_best_is_the_top_k_of_evals_last_row(qwen2, device):
    """eval_best's values and ids are the k best of eval's last row (value descending, then id; numpy's
    lexsort: logit_metrics.best_of), for a prompt and a decode step; the same step rerun writes the same KV rows."""
    if device == "cuda":
        from conftest import require_cuda
        require_cuda()
    s = M.Session(qwen2, threads=2, n_ctx=128, device=device)
    for tokens, at in ((np.arange(100, 130, dtype=np.int32), 0), (np.array([7], np.int32), 30)):
        row = s.eval(tokens, at)[-1].copy()
        for k in (1, 40, 256):
            vals, ids = s.eval_best(tokens, at, k)
            want_vals, want_ids = best_of(row, k)
            assert np.array_equal(ids, want_ids) and np.array_equal(vals, want_vals), (at, k)
    for k in (0, 257, len(row)):
        with pytest.raises(minfer.MinferError, match="top-k: k ="):
            s.eval_best(np.array([7], np.int32), 30, k)


def test_decode_greedy_is_eval_greedy_in_a_loop(qwen2):
    """Session.decode_greedy returns what eval_greedy step by step returns; on the CPU it is that loop
    (no device chain: chained_steps stays 0), and it refuses what eval refuses."""
    s = M.Session(qwen2, threads=2, n_ctx=64)
    prompt = np.arange(100, 109, dtype=np.int32)
    first = s.eval_greedy(prompt, 0)
    chained = s.decode_greedy(first, 9, 20)
    tok, loop = first, []
    for i in range(20):
        tok = s.eval_greedy(np.array([tok], np.int32), 9 + i)
        loop.append(tok)
    assert chained.dtype == np.int32 and chained.tolist() == loop
    assert s.chained_steps == 0
    for args, msg in (((first, 9, 0), "0 steps"), ((first, 60, 5), "exceed the context of 64"),
                      ((-1, 9, 2), "token id -1"), ((first, -1, 2), "negative start position")):
        with pytest.raises(minfer.MinferError, match=msg):
            s.decode_greedy(*args)


def test_greedy_on_nan_logits_is_an_error(tmp_path):
    """The argmax of NaN logits has no answer: eval_greedy and decode_greedy raise, as the sampler does."""
    s = M.Session(M.Model(str(nan_logits_model(tmp_path))), threads=2, n_ctx=32)
    assert np.isnan(s.eval(np.arange(5, dtype=np.int32), 0)).all()
    with pytest.raises(minfer.MinferError, match="logit 0 is NaN"):
        s.eval_greedy(np.arange(5, dtype=np.int32), 0)
    with pytest.raises(minfer.MinferError, match="NaN"):
        s.decode_greedy(3, 5, 4)


def test_engine_greedy_chunks_as_the_step_loop(qwen2):
    """minfer.engine.greedy decodes in chunks of decode_greedy: the same tokens as one step at a time,
    the same stop and context rules (a stop token is the last yielded; the steps past it are dropped)."""
    from minfer import engine

    s = M.Session(qwen2, threads=2, n_ctx=40)
    prompt = list(range(100, 109))

    def steps(max_tokens, stop=()):  # the loop greedy replaced: one eval_greedy a token
        tok, pos, out = s.eval_greedy(np.array(prompt, np.int32), 0), len(prompt), []
        for _ in range(max_tokens):
            out.append(tok)
            if tok in stop or pos >= s.n_ctx:
                break
            tok = s.eval_greedy(np.array([tok], np.int32), pos)
            pos += 1
        return out

    for max_tokens, chunk in ((1, 16), (5, 2), (25, 4), (100, 16)):  # 100: ends at the context
        assert list(engine.greedy(s, prompt, max_tokens, chunk=chunk)) == steps(max_tokens), (max_tokens, chunk)
    ref = steps(25)
    stop = ref[6]
    got = list(engine.greedy(s, prompt, 25, stop=[stop], chunk=4))
    assert got == ref[:ref.index(stop) + 1] == steps(25, stop=[stop])


@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0"])
@pytest.mark.parametrize("weights", ["f16", "q8_0"])  # f16 weights keep f32 activations: no rounding hides a change
def test_results_do_not_depend_on_batching(weights, kv_type):
    model = M.Model(str(synthetic_model(f"qwen2-tiny-{weights}")))
    # the same tokens through one prompt step, token by token, or in uneven chunks give bit-identical
    # logits: every kernel computes a token's row the same way whatever else is in the batch (the
    # 4-token GEMM kernels, decode and prefill attention), so prefix reuse equals a fresh prompt
    ids = np.array([5, 900, 77, 3, 12000, 42, 8, 1000, 64], np.int32)
    a = M.Session(model, threads=2, n_ctx=32, kv_type=kv_type).eval(ids, 0, all_logits=True)
    for cuts in ([1] * len(ids), [2, 4, 3], [5, 1, 3], [4, 4, 1]):
        s = M.Session(model, threads=2, n_ctx=32, kv_type=kv_type)
        parts, at = [], 0
        for n in cuts:
            parts.append(s.eval(ids[at:at + n], at, all_logits=True))
            at += n
        assert np.array_equal(a, np.concatenate(parts)), (kv_type, cuts, np.abs(a - np.concatenate(parts)).max())


def test_context_and_input_errors(qwen2):
    s = M.Session(qwen2, threads=2, n_ctx=16)
    with pytest.raises(minfer.MinferError, match="17 tokens at position 0 exceed the context of 16 tokens"):
        s.eval(np.zeros(17, np.int32), 0)
    with pytest.raises(minfer.MinferError, match="1 tokens at position 16 exceed the context of 16"):
        s.eval(np.zeros(1, np.int32), 16)
    with pytest.raises(minfer.MinferError, match="no tokens"):
        s.eval(np.zeros(0, np.int32), 0)
    with pytest.raises(minfer.MinferError, match=r"token id 151936 at index 1 is out of range \[0, 151936\)"):
        s.eval(np.array([1, 151936], np.int32), 0)
    with pytest.raises(minfer.MinferError, match="token id -1"):
        s.eval(np.array([-1], np.int32), 0)
    assert s.graph_builds == 0, "errors are raised before any graph is built or run"
    with pytest.raises(minfer.MinferError, match="n_ctx 100000 is larger than the model's context length"):
        M.Session(qwen2, n_ctx=100000)
    with pytest.raises(ValueError, match="kv_type must be"):
        M.Session(qwen2, kv_type="q4_0")
    with pytest.raises(minfer.MinferError, match="unknown backend assignment pattern"):
        M.Session(qwen2, assignment="random").eval(np.zeros(1, np.int32), 0)


def test_unsupported_architecture(tmp_path):
    from gguf_writer import STR, build_gguf, f32_tensor

    p = tmp_path / "g.gguf"
    p.write_bytes(build_gguf([("general.architecture", STR, "mamba")], [f32_tensor("x", np.ones(4))]).data)
    with pytest.raises(minfer.ModelError, match=r"architecture 'mamba' is not supported \(llama, qwen2, qwen3, gemma3\)"):
        M.Model(str(p))  # the registry (csrc/models/architectures.cpp) names what is


@pytest.mark.parametrize("extra,error", [
    ({"rope.scaling.type": "yarn"}, r"rope scaling 'yarn' is not supported \(only linear is\)"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": -2.0}, "rope scaling factor -2 is not a positive number"),
    ({"rope.scaling.factor": float("nan")}, "rope scaling factor nan is not a positive number"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}, None),
    ({"rope.scale_linear": 2.0}, None),  # the older key
])
def test_rope_scaling_is_linear_or_refused(tmp_path, extra, error):
    """Linear RoPE scaling loads; other kinds, and factors that are not positive numbers, are refused by name.
    (Its numbers: test_ops.test_rope against numpy, test_llamacpp_tiny against llama.cpp.)"""
    from tiny_models import llama_f32

    p = tmp_path / "m.gguf"
    llama_f32(str(p), extra)
    if error is None:
        M.Model(str(p))
    else:
        with pytest.raises(minfer.ModelError, match=error):
            M.Model(str(p))


def test_missing_tensor(tmp_path):
    from gguf_writer import STR, U32, F32, build_gguf, f32_tensor

    kv = [("general.architecture", STR, "llama"), ("llama.block_count", U32, 1), ("llama.embedding_length", U32, 8),
          ("llama.feed_forward_length", U32, 16), ("llama.attention.head_count", U32, 2),
          ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5)]
    p = tmp_path / "m.gguf"
    p.write_bytes(build_gguf(kv, [f32_tensor("token_embd.weight", np.ones((10, 8))),
                                  f32_tensor("output_norm.weight", np.ones(8))]).data)
    with pytest.raises(minfer.ModelError, match="has no tensor 'blk.0.attn_norm.weight'"):
        M.Model(str(p))


def test_plan_inspection_and_fusion(qwen2):
    s = M.Session(qwen2, threads=2, n_ctx=32)
    plan = s.plan(1)
    ops = [n["op"] for n in plan.nodes]
    # CPU-only decode: q/k/v and gate/up are fused, Mul(Silu) became part of FusedFFN
    assert ops.count("FusedQKV") == 2 and ops.count("FusedFFN") == 2
    assert "Silu" not in ops and "MatMul" in ops and plan.fusions == 6  # 2 x (SwiGLU, FFN, QKV)
    assert len(plan.splits) == 1 and plan.splits[0]["backend"] == 0
    rope_q = next(n for n in plan.nodes if n["name"] == "blk.0.rope_q")
    fused = rope_q["inputs"][0]
    assert plan.nodes[fused[0]]["op"] == "FusedQKV" and fused[1:] == (0, 128)  # q's window of [q|k|v]
    assert "op x backend" in plan.trace()
    # what the fusion pass tells a node of the projection that reads it (a GPU writes that product's input)
    feeds = {n["name"]: n.get("feeds") for n in plan.nodes if n["op"] in ("Attn", "FusedFFN")}
    assert feeds == {f"blk.{i}.{node}": f"blk.{i}.{w}.weight" for i in (0, 1)
                     for node, w in (("attn", "attn_output"), ("ffn_gate_up", "ffn_down"))}, feeds
    unfused = M.Session(qwen2, threads=2, n_ctx=32, fuse=False).plan(1)
    assert unfused.fusions == 0 and "FusedQKV" not in [n["op"] for n in unfused.nodes]


def test_fused_and_unfused_agree(qwen2):
    ids = np.array([11, 22, 33, 44], np.int32)
    a = M.Session(qwen2, threads=2, n_ctx=32).eval(ids, 0, all_logits=True)
    b = M.Session(qwen2, threads=2, n_ctx=32, fuse=False).eval(ids, 0, all_logits=True)
    assert np.array_equal(a, b), "fusion changes how work is grouped, not one rounding"


def test_step_by_step_read(qwen2):
    s = M.Session(qwen2, threads=2, n_ctx=32, keep_all=True)
    ids = np.array([5, 6, 7], np.int32)
    logits = s.eval(ids, 0, all_logits=True)
    plan = s.plan(3, True)
    assert np.array_equal(plan.read(plan.output), logits)
    emb = plan.read(2)  # token_embd rows
    w = minfer.gguf.open(synthetic_model("qwen2-tiny-q8_0")).tensors["token_embd.weight"]
    assert np.array_equal(emb[1], minfer.quants.dequantize(w.data[6], w.type))


@pytest.mark.parametrize("kv_type,tol", [("f32", 5e-3), ("q8_0", 5e-2)])
def test_kv_cache_types(kv_type, tol):
    model = M.Model(str(synthetic_model("qwen3-tiny-f32")))
    ids = np.arange(1000, 1040, dtype=np.int32)
    base = M.Session(model, threads=2, n_ctx=64).eval(ids, 0, all_logits=True)
    other = M.Session(model, threads=2, n_ctx=64, kv_type=kv_type).eval(ids, 0, all_logits=True)
    assert np.abs(base - other).max() <= tol


def test_trace_and_profile_settings():
    code = ("import numpy as np, minfer._minfer as M; m = M.Model(%r); s = M.Session(m, threads=1, n_ctx=16); "
            "s.eval(np.array([1, 2], np.int32), 0); p = s.op_profile(); assert p['MatMul'][1] > 0, p" %
            str(synthetic_model("llama-tiny-q8_0")))
    env = {**os.environ, "MINFER_GRAPH_TRACE": "1", "MINFER_OP_PROFILE": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "split 0: cpu" in r.stderr and "op x backend" in r.stderr and "FusedFFN" in r.stderr
    assert "minfer op profile" in r.stderr


def test_hugepage_copy_matches_the_mapping(setting):
    """MINFER_HUGEPAGES=1 loads a copy of the file into memory asked for 2 MB pages instead of mapping
    it: the same weights, so the same logits bit for bit; a bad value is an error naming the setting."""
    path = str(synthetic_model("qwen2-tiny-q4_0"))
    ids = np.array([5, 900, 77, 3, 12000, 42, 8], np.int32)
    mapped = M.Session(M.Model(path), threads=2, n_ctx=32).eval(ids, 0, all_logits=True)
    setting("MINFER_HUGEPAGES", "1")
    copied = M.Session(M.Model(path), threads=2, n_ctx=32).eval(ids, 0, all_logits=True)
    assert np.array_equal(np.asarray(mapped), np.asarray(copied))
    with pytest.raises(minfer.MinferError, match="MINFER_HUGEPAGES='yes': must be 0 or 1"):
        setting("MINFER_HUGEPAGES", "yes")
