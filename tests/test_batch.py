"""Many sequences at once, the batch step (minfer._minfer.BatchRunner): a ragged batch against the same
sequences run alone, the llama.cpp fixtures through the batch path, the CUDA batch products by row count,
paged attention against float64, copy-on-write, bad steps refused, and what a step returns (best logits, host
times, NaNs, the logits buffer).  The engine over it: test_batch_engine.py."""
import time

import numpy as np
import pytest

import minfer
from attention_ref import f16_attention_bound
from conftest import SYNTHETIC, layout_model, nan_logits_model, require_cuda, shared_path, synthetic_model
from logit_metrics import best_of, compare_topk
from minfer import _minfer
from minfer.quants import GGMLType as T, dequantize, quantize

TINY = "qwen2-tiny-q8_0"


def tables_for(runner, lens, rng):
    """Block tables for sequences of these lengths, over shuffled pool blocks (no two share one)."""
    perm = rng.permutation(runner.n_blocks)
    t = np.zeros((len(lens), runner.max_blocks), np.int32)
    k = 0
    for s, n in enumerate(lens):
        nb = -(-n // runner.block_size)
        t[s, :nb] = perm[k:k + nb]
        k += nb
    return t


def alone(model, ids, n_ctx, kv_type="f16"):
    """Each position's logits of one sequence on the single-sequence Session."""
    return _minfer.Session(model, n_ctx=n_ctx, threads=2, kv_type=kv_type).eval(np.asarray(ids, np.int32), 0,
                                                                              all_logits=True)


@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0"])
@pytest.mark.parametrize("name", [TINY, "llama-tiny-f32"])
def test_a_ragged_batch_equals_each_sequence_alone(name, kv_type, rng):
    """Prompts of different lengths in one step, then decode steps of one token each (plus a prompt
    joining mid-way): every sequence's logits are bit-identical to the sequence run alone."""
    model = _minfer.Model(str(synthetic_model(name)))
    runner = _minfer.BatchRunner(model, n_ctx=256, threads=2, kv_type=kv_type, kv_tokens=2048, block_size=16)
    vocab = runner.n_vocab
    seqs = [list(rng.integers(0, vocab, size=n)) for n in (5, 40, 17, 1)]
    late = list(rng.integers(0, vocab, size=23))
    tables = tables_for(runner, [120] * 5, rng)
    lens = [len(s) for s in seqs]
    out = runner.step(np.concatenate(seqs).astype(np.int32), np.concatenate([np.arange(n) for n in lens]).astype(np.int32),
                      np.array(lens, np.int32), tables[:4])
    for s, ids in enumerate(seqs):
        assert np.array_equal(out[s], alone(model, ids, 256, kv_type)[-1]), s
    for step in range(3):  # decode: one token per sequence; the fifth sequence's prompt joins at step 1
        nxt = [int(o.argmax()) for o in out]
        for s, t in enumerate(nxt[:4]):
            seqs[s].append(t)
        rows, pos, lens = [s[-1] for s in seqs], [len(s) - 1 for s in seqs], [1] * 4
        n_seqs = 4
        if step == 1:
            rows, pos, lens, n_seqs = rows + late, pos + list(range(len(late))), lens + [len(late)], 5
        out = runner.step(np.array(rows, np.int32), np.array(pos, np.int32), np.array(lens, np.int32), tables[:n_seqs])
        for s in range(n_seqs):
            ids = seqs[s] if s < 4 else late
            assert np.array_equal(out[s], alone(model, ids, 256, kv_type)[-1]), (step, s)
        if n_seqs == 5:  # late's first decode would go here; it stays a 5th prompt-only sequence
            out = out[:4]
    greedy = runner.step_greedy(np.array([s[-1] for s in seqs], np.int32), np.array([len(s) - 1 for s in seqs], np.int32),
                                np.ones(4, np.int32), tables[:4])
    assert list(greedy) == [int(alone(model, s, 256, kv_type)[-1].argmax()) for s in seqs]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("ids", ["ids16", "ids200"])
@pytest.mark.parametrize("name", SYNTHETIC)
def test_llamacpp_fixtures_through_the_batch_path(name, ids, device, rng):
    """The fixture's prompt and decode steps, each in a batch step beside another sequence, against
    llama.cpp's logits with the bounds of test_llamacpp_synthetic."""
    if device == "cuda":
        require_cuda()
    fx = np.load(shared_path("fixtures", "llamacpp", "synthetic", f"{name}__{ids}.npz"))
    tol = 5e-3 if name.endswith(("f32", "f16")) else 3e-2
    model = _minfer.Model(str(synthetic_model(name)))
    runner = _minfer.BatchRunner(model, n_ctx=512, threads=2, kv_tokens=1024, block_size=32, device=device)
    prompt = [int(t) for t in fx["prompt_ids"]]
    other = list(rng.integers(0, runner.n_vocab, size=9))
    tables = tables_for(runner, [300, 300], rng)
    out = runner.step(np.array(other + prompt, np.int32), np.array(list(range(9)) + list(range(len(prompt))), np.int32),
                      np.array([9, len(prompt)], np.int32), tables)
    assert np.abs(out[1] - fx["last_logits"]).max() <= tol
    dec = []
    for k, g in enumerate(fx["gen_ids"]):
        out = runner.step(np.array([int(out[0].argmax()), int(g)], np.int32), np.array([9 + k, len(prompt) + k], np.int32),
                          np.array([1, 1], np.int32), tables)
        dec.append(out[1])
    dm = compare_topk(np.stack(dec), fx["decode_topk_ids"], fx["decode_topk_logits"], fx["decode_lse"])
    assert dm["max_abs"] <= tol, dm


@pytest.mark.gpu
def test_cuda_batch_products_by_rows(force):
    """A CUDA batch step's products on Q8_0 weights whose rows are no 16-byte multiples (a bulk copy a row): int8 on
    8-bit activations at 2 rows, bf16 from 3 (the rule gives the forced kernel's bits, and the other kernel's
    differ), one token from each of n sequences."""
    require_cuda()
    model = _minfer.Model(str(synthetic_model("qwen2-tiny-q8_0")))

    def step(n, choice):
        force("cuda.batch_matmul", choice)
        runner = _minfer.BatchRunner(model, n_ctx=128, threads=2, kv_tokens=2048, block_size=32, device="cuda")
        tables = np.zeros((n, runner.max_blocks), np.int32)
        tables[:, 0] = np.arange(n)  # a block each
        return runner.step(np.arange(100, 100 + n, dtype=np.int32), np.zeros(n, np.int32), np.ones(n, np.int32), tables)

    for n, rule, other in ((2, "int8", "bf16"), (3, "bf16", "int8"), (17, "bf16", "int8")):
        auto = step(n, "auto")
        assert np.array_equal(auto, step(n, rule)), n
        assert not np.array_equal(auto, step(n, other)), n


@pytest.mark.gpu
def test_cuda_batch_products_of_a_layout_by_rows(force):
    """The 1.5B layout's Q4_K/Q6_K products (a tensor copy a stage): 2 rows take the matvec's rows kernel, 3-64 the
    bf16 tensor cores (the rule gives the forced kernel's bits; int8's differ), and a sequence's logits in a batch
    of 5 are the bits of its row in a batch of 16 (the product computes a row the same at every row count).  A
    kernel forced where the weights lack it (the matvec's rows kernel on Q8_0): an error naming it."""
    require_cuda()

    def step(model, n, choice):
        force("cuda.batch_matmul", choice)
        runner = _minfer.BatchRunner(model, n_ctx=64, threads=2, kv_tokens=2048, block_size=32, device="cuda")
        tables = np.zeros((n, runner.max_blocks), np.int32)
        tables[:, 0] = np.arange(n)
        return runner.step(np.arange(100, 100 + n, dtype=np.int32), np.zeros(n, np.int32), np.ones(n, np.int32), tables)

    model = _minfer.Model(str(layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m")))
    for n in (3, 64, 16):
        auto = step(model, n, "auto")
        assert np.isfinite(auto).all(), n
        assert np.array_equal(auto, step(model, n, "bf16")), n
        assert not np.array_equal(auto, step(model, n, "int8")), n
    assert np.array_equal(step(model, 5, "auto"), auto[:5])
    assert np.array_equal(step(model, 2, "auto"), step(model, 2, "matvec"))
    with pytest.raises(minfer.MinferError, match="cuda.batch_matmul=matvec"):
        step(_minfer.Model(str(synthetic_model("qwen2-tiny-q8_0"))), 2, "matvec")


@pytest.mark.gpu
@pytest.mark.parametrize("n,n_ctx", [(5, 1024), (64, 64)], ids=["combined", "unsplit"])
def test_cuda_batch_step_converts_one_input(n, n_ctx):
    """A CUDA batch step of one token a sequence (the 1.5B layout) converts one product's input (mma_act), the
    first layer's q/k/v (its norm has no residual to add: a plain RmsNorm, which writes no bf16): the other
    norms, the attention (its combine, or the unsplit tensor-core kernel: 5 sequences of 1024 positions split
    the keys, 64 of 64 do not) and the SwiGLU write them in gemm_mma's layout for the product after them; q, k
    and v (gate and up) of one weight type share a launch; RoPE of q and k and the store of k and v at the tokens'
    pool rows are one kernel a layer (FusedQkvRope: past one row, rope_kv_store after the product).  Each sequence's
    logits follow the CPU's up to their sign: this random-weight layout collapses every input onto one direction
    of logits, +u or -u (any two sequences' logits correlate at +-1 on the CPU alone), and which sign a sequence
    gets turns on rounding (4 of these 64 flip between the CPU's 8-bit products and CUDA's bf16).  So this check
    cannot see a wrongly laid out input; test_cuda's test_batch_products_take_the_bf16_their_producer_wrote
    compares each producer and product's bits."""
    require_cuda()
    path = layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    model = _minfer.Model(str(path))
    types = {k: t.type for k, t in minfer.gguf.open(str(path)).tensors.items()}
    # q, k and v in one launch where they share a weight type (else a launch each), gate and up alike; o, down
    def shared(i, names):
        return 1 if len({types[f"blk.{i}.{w}.weight"] for w in names}) == 1 else len(names)
    launches = 1 + sum(shared(i, ("attn_q", "attn_k", "attn_v")) + shared(i, ("ffn_gate", "ffn_up")) + 2
                       for i in range(28))
    ids = np.arange(100, 100 + 2 * n, dtype=np.int32).reshape(2, n)
    out = {}
    for device in ("cuda", "cpu"):
        runner = _minfer.BatchRunner(model, n_ctx=n_ctx, threads=2, kv_tokens=n * n_ctx, block_size=32, device=device)
        tables = np.arange(n * runner.max_blocks, dtype=np.int32).reshape(n, runner.max_blocks)
        runner.step(ids[0], np.zeros(n, np.int32), np.ones(n, np.int32), tables)
        before = _minfer.cuda_launch_counts()
        out[device] = runner.step(ids[1], np.ones(n, np.int32), np.ones(n, np.int32), tables)
        launched = {k: v - before.get(k, 0) for k, v in _minfer.cuda_launch_counts().items()}
        if device == "cuda":
            assert launched.get("mma_act", 0) == 1, launched
            assert launched["gemm_mma"] == launches
            assert launched.get("rope_kv_store", 0) == 28, launched
            place = runner.placement()
            assert "FusedQkvRope" in place and "Rope" not in place and "KvStore" not in place, place
    for s in range(n):  # bf16 products against the CPU's 8-bit ones, 28 layers deep: the same logits, not the bits
        assert abs(np.corrcoef(out["cuda"][s], out["cpu"][s])[0, 1]) >= 0.99, s


@pytest.mark.gpu
def test_cuda_two_sequences_are_each_alone(force):
    """A CUDA batch of two sequences (the 1.5B layout: Q4_K/Q6_K products on the matvec's two-row kernel) gives
    each sequence the bits of that sequence stepped alone, over two steps (the second attends two rows): the
    tensor-core decode attention computes a (KV head, row, split) block the same in any batch, and a sequence
    alone (one row: q/k/v's matvec rotates and stores in its epilogue, at the token's pool row -- blocks 5 and 7
    here, not its position's row) as rope_kv_store does after the two-row product."""
    require_cuda()
    model = _minfer.Model(str(layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m")))
    toks = np.array([[17, 923], [151000, 5]], np.int32)

    def run(ids):
        n = len(ids)
        runner = _minfer.BatchRunner(model, n_ctx=64, threads=2, kv_tokens=1024, block_size=32, device="cuda")
        tables = np.zeros((n, runner.max_blocks), np.int32)
        tables[:, 0] = 5 + 2 * np.arange(n)
        return [runner.step(ids[:, s].copy(), np.full(n, s, np.int32), np.ones(n, np.int32), tables) for s in (0, 1)]

    both = run(toks)
    for i in range(2):
        alone = run(toks[i:i + 1])
        for s in (0, 1):
            d = np.abs(both[s][i] - alone[s][0]).max()
            assert np.array_equal(both[s][i], alone[s][0]), f"sequence {i}, step {s}: max difference {d:.3g}"


@pytest.mark.parametrize("backend,kernel", [("cpu", ""), ("reference", ""),
                                            pytest.param("cuda", "auto", marks=pytest.mark.gpu),
                                            pytest.param("cuda", "general", marks=pytest.mark.gpu),
                                            pytest.param("cuda", "group=1", marks=pytest.mark.gpu),
                                            pytest.param("cuda", "group=all", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("bs", [16, 32])
def test_paged_attention_against_float64(rng, force, backend, kernel, kv_type, bs):
    """KvStore at pool rows and Attn through block tables (two sequences, scattered blocks, a prefill chunk
    of one and a decode row of the other) against softmax attention in float64 over the rows the test
    placed itself.  CUDA: an f16 cache takes the tensor-core decode kernel (a KV head's
    four query heads at once; q and the weights rounded to f16: attention_ref.f16_attention_bound), or with
    cuda.attention=warp the warp kernels (a block per query head, or per KV head attending its query heads in
    turn: group=1 / group=all); other caches (or cuda.attention=general) the general kernel."""
    if backend == "cuda":
        require_cuda()
        if kernel.startswith("group="):
            force("cuda.attention", "warp")
            force("cuda.attention_group", kernel[6:])
        else:
            force("cuda.attention", kernel)
    tensor_cores = backend == "cuda" and kernel == "auto" and kv_type == "f16"  # blocks of 16 and 32
    model = _minfer.Model(str(synthetic_model(TINY)))
    sess = _minfer.Session(model, threads=2, device="cuda" if backend == "cuda" else "cpu")
    n_head, n_head_kv, hd, n_blocks = 8, 2, 64, 12
    kv_dim = n_head_kv * hd
    # sequence 0: 40 keys already stored (positions 0..39), a decode row at 40; sequence 1: a chunk of 5
    # rows at positions 20..24 over 20 stored keys
    tables = np.array([[7, 2, 9, 0], [4, 11, 0, 0]], np.int32)

    def slot(s, p):
        return tables[s, p // bs] * bs + p % bs
    K = (rng.standard_normal((n_blocks * bs, kv_dim)) * 2).astype(np.float32)
    V = rng.standard_normal((n_blocks * bs, kv_dim)).astype(np.float32)
    if kv_type == "f16":
        K, V = K.astype(np.float16).astype(np.float32), V.astype(np.float16).astype(np.float32)
    if kv_type == "q8_0":  # the values a q8_0 row stores: blocks of 32 rounded to d * int8
        K, V = (dequantize(quantize(M.ravel(), T.Q8_0), T.Q8_0).reshape(M.shape) for M in (K, V))
    rows = [(0, 40)] + [(1, p) for p in range(20, 25)]
    n = len(rows)
    q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
    # the step stores every row's own k, v; earlier keys are stored by a first step over all of them
    past = [(0, p) for p in range(40)] + [(1, p) for p in range(20)]
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=hd, kv_type=kv_type, n_ctx=n_blocks * bs,
                attn_scale=float(1 / np.sqrt(hd)), layer=0, block_size=bs)
    every = past + rows
    k_all = np.stack([K[slot(s, p)] for s, p in every])
    v_all = np.stack([V[slot(s, p)] for s, p in every])
    slots = np.array([[slot(s, p)] for s, p in every], np.int32)
    pos = np.array([[p] for s, p in every], np.int32)
    seq = np.array([[s] for s, p in every], np.int32)
    q_all = np.zeros((len(every), n_head * hd), np.float32)
    q_all[len(past):] = q
    # rows sequence by sequence: reorder so each sequence's rows are contiguous
    order = sorted(range(len(every)), key=lambda i: every[i][0])
    inputs = [q_all[order], k_all[order], v_all[order], slots[order], pos[order], seq[order], tables]
    N = len(every)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=N, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 4, 7, 5, 6], rows=N, cols=n_head * hd, meta=meta)]
    out = sess.run_ops(backend, inputs, nodes)[-1]
    g = n_head // n_head_kv
    for oi, i in enumerate(order):
        if i < len(past):
            continue
        s, p = every[i]
        for h in range(n_head):
            kh = slice((h // g) * hd, (h // g + 1) * hd)
            keys = np.stack([K[slot(s, j), kh] for j in range(p + 1)]).astype(np.float64)
            vals = np.stack([V[slot(s, j), kh] for j in range(p + 1)]).astype(np.float64)
            sc = keys @ q_all[i, h * hd:(h + 1) * hd].astype(np.float64) / np.sqrt(hd)
            w = np.exp(sc - sc.max())
            w /= w.sum()
            got, want = out[oi, h * hd:(h + 1) * hd], w @ vals
            if tensor_cores:
                qh = q_all[i:i + 1, h * hd:(h + 1) * hd]
                assert np.abs(got - want).max() <= f16_attention_bound(qh, keys, vals, 1, 1, hd), (s, p, h)
            else:
                assert np.allclose(got, want, atol=2e-5, rtol=1e-5), (s, p, h)


def test_bad_steps_are_refused(rng):
    model = _minfer.Model(str(synthetic_model(TINY)))
    runner = _minfer.BatchRunner(model, n_ctx=64, threads=2, kv_tokens=256, block_size=16)
    t = np.zeros((2, runner.max_blocks), np.int32)
    t[0, 0], t[1, 0] = 1, 2
    ok = dict(tokens=np.array([1, 2, 3], np.int32), positions=np.array([0, 1, 0], np.int32),
              seq_lens=np.array([2, 1], np.int32), tables=t)
    runner.step(**ok)
    with pytest.raises(ValueError, match="add up to"):
        runner.step(**{**ok, "seq_lens": np.array([1, 1], np.int32)})
    with pytest.raises(ValueError, match="tables must be"):
        runner.step(**{**ok, "tables": t[:, :2]})
    with pytest.raises(minfer.MinferError, match="outside the context"):
        runner.step(**{**ok, "positions": np.array([0, 64, 0], np.int32)})
    bad = t.copy()
    bad[1, 0] = runner.n_blocks
    with pytest.raises(minfer.MinferError, match="outside the pool"):
        runner.step(**{**ok, "tables": bad})
    shared = t.copy()
    shared[1, 0] = 1  # both sequences write row 0 of block 1
    with pytest.raises(minfer.MinferError, match="same KV row"):
        runner.step(**{**ok, "tables": shared})
    with pytest.raises(minfer.MinferError, match="token id"):
        runner.step(**{**ok, "tokens": np.array([1, -4, 3], np.int32)})
    with pytest.raises(minfer.MinferError, match="block_size"):
        _minfer.BatchRunner(model, n_ctx=64, kv_tokens=256, block_size=24)


def test_copy_block_makes_an_equal_copy(rng):
    """A sequence read through a copied block (copy-on-write) gives the logits it gave through the original."""
    model = _minfer.Model(str(synthetic_model(TINY)))
    runner = _minfer.BatchRunner(model, n_ctx=64, threads=2, kv_tokens=256, block_size=16)
    ids = rng.integers(0, runner.n_vocab, size=20).astype(np.int32)
    t = np.zeros((1, runner.max_blocks), np.int32)
    t[0, :2] = [3, 5]
    runner.step(ids, np.arange(20, dtype=np.int32), np.array([20], np.int32), t)
    nxt = np.array([7], np.int32)
    a = runner.step(nxt, np.array([20], np.int32), np.array([1], np.int32), t)
    runner.copy_block(5, 9)
    t2 = t.copy()
    t2[0, 1] = 9
    b = runner.step(nxt, np.array([20], np.int32), np.array([1], np.int32), t2)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_step_best_is_each_rows_best_of_the_step(device, rng):
    """step_best's values and ids are the k best of step()'s logits for the same step (the step rerun writes the
    same KV rows), at k = 1, 40 and its most; the tiny model's 152k-token vocabulary."""
    if device == "cuda":
        require_cuda()
    model = _minfer.Model(str(synthetic_model(TINY)))
    runner = _minfer.BatchRunner(model, n_ctx=128, threads=2, kv_tokens=1024, block_size=16, device=device)
    lens = [7, 1, 30, 2]
    seqs = [rng.integers(0, runner.n_vocab, size=n).astype(np.int32) for n in lens]
    args = (np.concatenate(seqs), np.concatenate([np.arange(n) for n in lens]).astype(np.int32),
            np.array(lens, np.int32), tables_for(runner, [64] * 4, rng))
    logits = runner.step(*args).copy()
    for k in (1, 40, runner.best_max):
        vals, ids = runner.step_best(*args, k=k)
        want_vals, want_ids = best_of(logits, k)
        assert np.array_equal(ids, want_ids) and np.array_equal(vals, want_vals), k
    for k in (0, runner.best_max + 1, runner.n_vocab):
        with pytest.raises(minfer.MinferError, match="step_best: k"):
            runner.step_best(*args, k=k)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_step_times_count_each_step_within_its_wall_time(device, rng):
    """step_times sums the host's seconds in the steps by phase (prepare, launch, read back) and counts the steps
    of every kind; the sums stay within the wall time around the calls, and a refused step counts nothing."""
    if device == "cuda":
        require_cuda()
    runner = _minfer.BatchRunner(_minfer.Model(str(synthetic_model(TINY))), n_ctx=128, threads=2, kv_tokens=1024,
                                 block_size=16, device=device)
    t0 = runner.step_times()
    assert t0 == dict(prepare_s=0.0, launch_s=0.0, read_s=0.0, steps=0)
    lens = [5, 3]
    args = (rng.integers(0, 1000, size=8).astype(np.int32), np.array([0, 1, 2, 3, 4, 0, 1, 2], np.int32),
            np.array(lens, np.int32), tables_for(runner, [64, 64], rng))
    wall = time.perf_counter()
    runner.step(*args)
    runner.step_greedy(*args)
    runner.step_best(*args, k=40)
    wall = time.perf_counter() - wall
    t = runner.step_times()
    assert t["steps"] == 3
    phases = [t[k] for k in ("prepare_s", "launch_s", "read_s")]
    assert all(p > 0.0 for p in phases) and sum(phases) <= wall
    with pytest.raises(minfer.MinferError):
        runner.step_greedy(np.array([runner.n_vocab], np.int32), np.array([9], np.int32), np.array([1], np.int32),
                           tables_for(runner, [64], rng))
    assert runner.step_times()["steps"] == 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_nan_logits_in_a_batch_step_are_an_error(device, tmp_path, rng):
    """A NaN logit fails the step that reads it -- step_best and step_greedy, one row or several -- instead of
    a token chosen past it."""
    if device == "cuda":
        require_cuda()
    runner = _minfer.BatchRunner(_minfer.Model(str(nan_logits_model(tmp_path))), n_ctx=64, threads=2, kv_tokens=128,
                                 block_size=16, device=device)
    for n in (1, 3):
        args = (np.full(n, 3, np.int32), np.zeros(n, np.int32), np.ones(n, np.int32),
                tables_for(runner, [8] * n, rng))
        with pytest.raises(minfer.MinferError, match="NaN"):
            runner.step_best(*args, k=40)
        with pytest.raises(minfer.MinferError, match="NaN"):
            runner.step_greedy(*args)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_step_writes_logits_into_the_runners_buffer(device, rng):
    """step(out=logits_buffer(n)) gives the logits a plain step() gives, in the runner's buffer (pinned host
    memory on CUDA: the copy lands there directly); a buffer of the wrong shape or type is refused."""
    if device == "cuda":
        require_cuda()
    model = _minfer.Model(str(synthetic_model(TINY)))
    runner = _minfer.BatchRunner(model, n_ctx=64, threads=2, kv_tokens=1024, block_size=16, device=device)
    tables = tables_for(runner, [40] * 3, rng)
    ids = rng.integers(0, runner.n_vocab, size=3).astype(np.int32)
    args = (ids, np.zeros(3, np.int32), np.ones(3, np.int32), tables)
    want = runner.step(*args)
    buf = runner.logits_buffer(4)
    assert buf.shape == (4, runner.n_vocab) and buf.dtype == np.float32
    got = runner.step(*args, out=buf)
    assert got.shape == (3, runner.n_vocab) and np.shares_memory(got, buf)
    assert np.array_equal(got, want)
    assert runner.logits_buffer(2).ctypes.data == buf.ctypes.data  # the same memory
    with pytest.raises(minfer.MinferError, match="holds 4 rows"):
        runner.logits_buffer(5)
    with pytest.raises(ValueError, match="out must be"):
        runner.step(*args, out=np.zeros((2, runner.n_vocab), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        runner.step(*args, out=np.zeros((4, runner.n_vocab), np.float64))
