"""The CUDA backend's correctness ladder, rungs 2 and 3 (issue 6): whole forward passes against the CPU
backend (the real 0.5B layout, the decode fusions), the device's argmax and greedy chains, speculative and
constrained decoding on the device, and what only a GPU has: graph replay, a long cache, mixed CPU/GPU graphs,
bounded waits.  Rung 1 (each op against the reference backend): test_cuda.py.  Every test needs an NVIDIA GPU
and skips, saying why, where there is none (CI)."""
import numpy as np
import pytest

import minfer
from backend_compare import close
from conftest import layout_model, nan_logits_model, require_cuda, synthetic_model
from cuda_cases import M, forward, random_weight, _gpu  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def q05_model():
    require_cuda()
    return M.Model(str(layout_model("qwen2.5-coder-0.5b-instruct-q4_k_m")))


def test_forward_matches_cpu_on_the_real_layout(q05_model, rng):
    """qwen2.5-coder-0.5b's layout (Q5_0/Q8_0/Q4_K/Q6_K): 33 prompt tokens (the
    tensor-core path) and 6 decode steps (matvec, graph replay from the second
    step) against the CPU backend.  The two differ by design in how activations
    are rounded before each matmul (CPU: 8-bit blocks, as llama.cpp; GPU: f32 for
    decode, f16 for prefill); the bound is the one the CPU itself meets against
    llama.cpp on the quantized synthetic models (3e-2, test_llamacpp_synthetic),
    relative to the logits' scale here."""
    prompt = rng.integers(0, 151936, size=33).astype(np.int32)
    gpu, sg = forward(q05_model, "cuda", prompt, 6)
    cpu, _ = forward(q05_model, "cpu", prompt, 0)
    assert sg.device == "cuda"
    scale = np.abs(cpu).max()
    d = np.abs(gpu[:33] - cpu).max()
    assert d <= 3e-2 * scale, (d, scale)


@pytest.mark.parametrize("name", ["q05", "qwen3"])
def test_decode_fusions(q05_model, name, rng, force):
    """On CUDA the decode graph fuses q/k/v (with qwen3's norms), gate/up, RoPE + KV store (qwen2: into the
    q/k/v projection) and each residual add with the next norm, and the
    fused forward pass matches the unfused one.  Decode keeps its activations f32 for the comparison: the
    fused norm sums in another order, and an ulp of difference would move an 8-bit activation by a step."""
    force("cuda.decode_activations", "f32")
    # and the prompt's products on f16 slices: the bf16 product's split of K follows its launch's blocks, so q, k
    # and v in one launch sum in another order than each alone (the bf16 layouts the fused producers write are
    # checked bit for bit in test_batch_products_take_the_bf16_their_producer_wrote)
    force("cuda.batch_matmul", "f16")
    model = q05_model if name == "q05" else M.Model(str(synthetic_model("qwen3-tiny-q8_0")))
    s = M.Session(model, threads=4, n_ctx=256, device="cuda")
    ops = [n["op"] for n in s.plan(1).nodes]
    n_layer = ops.count("Attn")
    if name == "qwen3":  # the per-head norms sit between the projection and the rotation
        assert ops.count("FusedQkvNorm") == n_layer and ops.count("RopeKvStore") == n_layer
    else:  # the projection rotates and stores itself (FusedQkvRope)
        assert ops.count("FusedQkvRope") == n_layer and "RopeKvStore" not in ops and "FusedQKV" not in ops
    assert ops.count("FusedFFN") == n_layer
    assert "KvStore" not in ops and "Rope" not in ops and "QkNorm" not in ops and "Add" not in ops
    assert ops.count("AddRmsNorm") == 2 * n_layer and ops.count("RmsNorm") == 1  # the first attn_norm
    # the fusion pass tells each add + norm before a layer's q/k/v projection which q weight it feeds
    feeds = [n.get("feeds_q") for n in s.plan(1).nodes if n["op"] == "AddRmsNorm"]
    assert [f for f in feeds if f] == [f"blk.{i}.attn_q.weight" for i in range(1, n_layer)], feeds
    prompt = rng.integers(0, 151936, size=5).astype(np.int32)
    fused, _ = forward(model, "cuda", prompt, 4)
    unfused, _ = forward(model, "cuda", prompt, 4, fuse=False)
    close(fused, unfused, 1e-5)


@pytest.mark.parametrize("n", [1000, 4096, 4097, 151936, 152064])
def test_device_argmax(n, rng):
    """Greedy decoding's device argmax (blocks of 4096 values, then one block over their winners) against
    numpy's at real vocabulary sizes, with the maximum in the first, a middle and the last block, ties across
    blocks (the first index wins), all -inf (token 0, as a scan), a NaN (flagged, never the winner), and runs
    back to back (each reuses the scratch of the one before)."""
    x = rng.standard_normal(n).astype(np.float32)
    for where in sorted({0, 4095 % n, min(4096, n - 1), n // 2, n - 1}):
        y = x.copy()
        y[where] = 10.0
        assert M.cuda_argmax(y, 5) == ([where] * 5, False)
    y = x.copy()
    y[[n // 3, n - 1]] = 10.0  # in different blocks where n > 4096
    assert M.cuda_argmax(y, 3) == ([n // 3] * 3, False)
    assert M.cuda_argmax(np.full(n, -np.inf, np.float32), 2) == ([0, 0], False)
    y = x.copy()
    y[n - 2] = np.nan
    assert M.cuda_argmax(y, 2) == ([int(np.nanargmax(y))] * 2, True)
    with pytest.raises(minfer.MinferError, match="cuda_argmax: 1 rows of 0 values"):
        M.cuda_argmax(np.zeros(0, np.float32))


def first_best(x, allow=None):
    """numpy's argmax of each row among the allowed (bit i of allow[r, i // 32]), NaN never winning: the first
    index of the row's largest value, 0 where nothing is finite or allowed (as a scan from -inf picks)."""
    y = np.where(np.isnan(x), -np.inf, x)
    if allow is not None:
        bits = np.unpackbits(allow.view(np.uint8), axis=1, bitorder="little")[:, :x.shape[1]].astype(bool)
        y = np.where(bits, y, -np.inf)
    return [int(np.argmax(r)) for r in y]


@pytest.mark.parametrize("n", [1000, 4097, 152064])
@pytest.mark.parametrize("rows", [3, 64])
def test_device_argmax_rows(n, rows, rng):
    """A batch step's argmax: every row in one launch pair (at 152064 values 26 rows fit the scratch: 64 rows are
    three launches), each row's winner placed apart, ties across blocks, a row all -inf, NaN rows (flagged, never
    chosen), and with masks (a batch of constrained rows: the winner among the allowed, a row with none allowed)
    against numpy, twice back to back."""
    x = rng.standard_normal((rows, n)).astype(np.float32)
    for r in range(rows):
        x[r, (r * 7919) % n] = 10.0 + r % 3  # winners in every block position across the rows
    x[1, [n // 3, n - 1]] = 20.0  # a tie across blocks: the first wins
    x[rows - 1] = -np.inf
    assert M.cuda_argmax(x, 2) == (first_best(x) * 2, False)
    y = x.copy()
    y[0, 5] = np.nan
    y[2, n - 1] = np.nan
    assert M.cuda_argmax(y, 1) == (first_best(y), True)
    words = (n + 31) // 32
    allow = rng.integers(0, 2**32, size=(rows, words), dtype=np.uint64).astype(np.uint32)
    allow[0] = 0  # nothing allowed: token 0
    allow[1, :] = 0
    allow[1, (n // 2) // 32] = 1 << ((n // 2) % 32)  # only one token allowed
    got = M.cuda_argmax(x, 2, allow)
    assert got == (first_best(x, allow) * 2, False)
    assert got[0][1] == n // 2
    with pytest.raises(ValueError, match="allow must be"):
        M.cuda_argmax(x, 1, allow[:, :-1])


def test_greedy_on_device_matches_host_argmax(q05_model, rng):
    s = M.Session(q05_model, threads=4, n_ctx=64, device="cuda")
    prompt = rng.integers(0, 151936, size=7).astype(np.int32)
    for start, toks in ((0, prompt), (7, prompt[:1]), (8, prompt[:1])):
        logits = s.eval(toks, start)
        assert s.eval_greedy(toks, start) == int(np.argmax(logits[-1]))


def test_greedy_chain_on_device(q05_model, rng):
    """decode_greedy on CUDA runs its steps as a device chain (the argmax writes the next step's token and
    advances the position; chained_steps counts them) and picks what eval_greedy in a loop picks, across
    the chain's wait every 256 steps; the session's steps from host inputs go on after it."""
    s = M.Session(q05_model, threads=4, n_ctx=320, device="cuda")
    prompt = rng.integers(0, 151936, size=7).astype(np.int32)
    first = s.eval_greedy(prompt, 0)
    chained = s.decode_greedy(first, 7, 300)
    assert s.chained_steps == 300
    tok, loop = first, []
    for i in range(300):
        tok = s.eval_greedy(np.array([tok], np.int32), 7 + i)
        loop.append(tok)
    assert chained.tolist() == loop
    assert s.decode_greedy(int(chained[9]), 17, 3).tolist() == loop[10:13]  # a chain from the middle
    assert s.chained_steps == 303
    with pytest.raises(minfer.MinferError, match="exceed the context"):
        s.decode_greedy(first, 300, 21)


def test_greedy_chain_on_a_short_step():
    """The device chain on the tiny layout, whose steps are a few microseconds: its tokens are eval_greedy's
    in a loop.  Each step's first kernel waits for the previous step's argmax before it lets the next kernels
    start; releasing first, they read the position before the argmax had advanced it (wrong from step 3)."""
    path = str(synthetic_model("qwen2-tiny-q8_0"))
    prompt = np.array([9707, 1879, 11, 419, 374], np.int32)
    s = M.Session(M.Model(path), threads=2, n_ctx=256, device="cuda")
    first = s.eval_greedy(prompt, 0)
    chained = s.decode_greedy(first, len(prompt), 60).tolist()
    tok, loop = first, []
    for i in range(60):
        tok = s.eval_greedy(np.array([tok], np.int32), len(prompt) + i)
        loop.append(tok)
    assert chained == loop


def test_llm_greedy_takes_the_device_chain(monkeypatch):
    """minfer.LLM's greedy generation on CUDA takes its tokens from decode_greedy (chained_steps grows) and
    gives the tokens of the path that reads each step's logits back and samples them on the host."""
    llm = minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, backend="cuda")
    ids = llm.tokenize("Hello world, this is")
    assert llm._session.chains
    before = llm._session.chained_steps
    chained = llm.generate(ids, max_tokens=40)
    assert llm._session.chained_steps > before
    monkeypatch.setattr(minfer.llm, "GREEDY_CHUNK", 0)
    # a second LLM, so that its prompt is prefilled too (the first one's cache would have its last prompt token
    # evaluated as a decode step: other arithmetic for the first token's logits)
    host = minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, backend="cuda").generate(ids, max_tokens=40)
    assert chained.tokens == host.tokens and chained.text == host.text and len(host.tokens) > 1


def test_speculative_on_the_device():
    """A draft model (and prompt lookup) on CUDA, both models on the device: every greedy token is the argmax of
    the target's logits for its prefix (LLM.logits: one prefill, other arithmetic) up to rounding -- the tiny
    random model's top logits lie within hundredths of each other, a token of a wrong row ~0.9 below --, sampled
    tokens (top-k 4) are among the 4 likeliest, drafts are kept and rejected, and the tokens between drafts
    come from the device's chained steps."""
    from minfer.speculative import MAX_DRAFT, DraftLength

    llm = minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, backend="cuda",
                     draft_model=str(synthetic_model("qwen2-tiny-q4_0")), draft_p_min=0.0)
    llm._lookup_policy = DraftLength(MAX_DRAFT, timed=False)
    llm._draft.policy = DraftLength(MAX_DRAFT, timed=False)
    before = llm._session.chained_steps
    drafted = accepted = 0
    for i, prompt in enumerate(["def add(a, b):\n    return a + b\n", "one two three one two three", "x = [1, 2,"]):
        ids = llm.tokenize(prompt)
        for kw in (dict(), dict(lookup=True), dict(temperature=0.8, top_k=4, seed=i)):
            out = llm.generate(ids, max_tokens=40, **kw)
            drafted += out.metrics.drafted_tokens
            accepted += out.metrics.accepted_tokens
            rows = llm.logits(ids + out.tokens[:-1])[len(ids) - 1:]
            for row, t in zip(rows, out.tokens):
                if kw.get("temperature"):
                    assert row[t] >= np.sort(row)[-4] - 0.02, (prompt, kw)
                else:
                    assert row[t] >= row.max() - 0.02, (prompt, kw, row.max() - row[t])
    assert drafted > accepted > 0 and llm._session.chained_steps > before
    llm.close()


def test_greedy_on_nan_logits_is_an_error(tmp_path):
    """The device argmax flags NaN logits: eval_greedy and the device chain raise instead of returning token 0."""
    s = M.Session(M.Model(str(nan_logits_model(tmp_path))), threads=2, n_ctx=320, device="cuda")
    for _ in range(2):  # the second step replays the captured graph
        with pytest.raises(minfer.MinferError, match="logit is NaN"):
            s.eval_greedy(np.array([3], np.int32), 5)
    with pytest.raises(minfer.MinferError, match="logit is NaN"):
        s.decode_greedy(3, 5, 4)
    with pytest.raises(minfer.MinferError, match="logit is NaN"):  # raised at the chain's first wait
        s.decode_greedy(3, 6, 300)


def test_graph_replay_is_exact(q05_model, rng, setting):
    """Replayed decode steps compute exactly what launching each kernel computes."""
    prompt = rng.integers(0, 151936, size=9).astype(np.int32)
    with_graphs, _ = forward(q05_model, "cuda", prompt, 12)
    setting("MINFER_CUDA_GRAPHS", "0")
    without, _ = forward(q05_model, "cuda", prompt, 12)
    assert np.array_equal(with_graphs, without)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_long_cache_short_context(q05_model, rng, kv_type):
    """Decode attention has a split per 128 positions of the whole cache; the splits past the position hold
    nothing and are never merged.  A 9-token prompt and 12 steps in a cache of 8192 positions (64 splits,
    63 of them empty) give the logits of a 256-position cache (2 splits) bit for bit, with the f16 cache's
    kernel and with the general one (q8_0 cache)."""
    prompt = rng.integers(0, 151936, size=9).astype(np.int32)
    short, _ = forward(q05_model, "cuda", prompt, 12, kv_type=kv_type)
    long, _ = forward(q05_model, "cuda", prompt, 12, n_ctx=8192, kv_type=kv_type)
    assert np.array_equal(short, long)


def test_mixed_graph_splits(q05_model, rng, force, setting):
    """Ops forced to the CPU (MINFER_CPU_OPS): the plan alternates devices and
    copies across at each split, and the logits still match the all-GPU run
    (the moved ops are exact elementwise ops and rope, so only f32 rounding differs).  Decode keeps its
    activations f32 here: rounding them to 8 bits would turn an ulp of difference in x into a step of
    d / 127 in a matvec input, which is what the activation rounding costs, not what splits do."""
    force("cuda.decode_activations", "f32")
    prompt = rng.integers(0, 151936, size=12).astype(np.int32)
    ref, _ = forward(q05_model, "cuda", prompt, 4)
    setting("MINFER_CPU_OPS", "Rope,Add")
    mixed, s = forward(q05_model, "cuda", prompt, 4)
    splits = s.plan(1).splits
    backends = {sp["backend"] for sp in splits}
    assert backends == {0, 1} and len(splits) > 50, splits[:4]
    scale = np.abs(ref).max()
    assert np.abs(mixed - ref).max() <= 1e-3 * scale


def test_unknown_cpu_op_is_an_error(setting):
    with pytest.raises(minfer.MinferError, match="MINFER_CPU_OPS='Rop': unknown op 'Rop'"):
        setting("MINFER_CPU_OPS", "Rop")


def test_wait_is_bounded(q05_model, setting):
    """A wait that outlasts MINFER_GPU_TIMEOUT_S is an exception (here the wait
    for the 0.5 GB weight upload, which cannot finish within a microsecond)."""
    setting("MINFER_GPU_TIMEOUT_S", "0.000001")
    with pytest.raises(minfer.MinferError, match="did not finish within 0.0 s"):
        M.Session(q05_model, device="cuda")


def test_kernel_entry_points_wait_bounded(rng, setting):
    """cuda_matmul and cuda_copy_bandwidth (the kernel-level entry points the tests and benchmarks use) wait with
    the backend's bound too: a GEMM of 256 rows over 4096 x 4096 weights, or 20 copies of 256 MB, cannot finish
    within a microsecond, so the wait is an exception naming the bound -- and the GPU, which was never hung, then
    runs the same call to the end (the timed-out call's memory is left allocated, not freed under a kernel)."""
    t, w = random_weight("q4_k", 4096, 4096, rng)
    x = rng.standard_normal((256, 4096)).astype(np.float32)
    setting("MINFER_GPU_TIMEOUT_S", "0.000001")
    with pytest.raises(minfer.MinferError, match=r"running the matmul: the GPU did not finish within 1e-06 s"):
        M.cuda_matmul(t, w, x, 4096, path="gemm")
    with pytest.raises(minfer.MinferError, match=r"the GPU did not finish within 1e-06 s \(MINFER_GPU_TIMEOUT_S\)"):
        M.cuda_copy_bandwidth(1 << 28, 20)
    setting("MINFER_GPU_TIMEOUT_S", "")
    y, _ = M.cuda_matmul(t, w, x[:2], 4096, path="q8")
    assert y.shape == (2, 4096) and np.all(np.isfinite(y))
    assert M.cuda_copy_bandwidth(1 << 26, 4) > 1e11


def test_constrained_generation_on_the_device(q05_model):
    """JSON-schema output on CUDA (the 0.5B layout, random weights: it would emit anything): one sequence (greedy:
    the device's argmax among the allowed, the mask computed while the step runs; sampled: the host sampler) and
    the batch engine with a plain request beside; every output validates, and each greedy token is the best the
    grammar allows in the device's own logits for the whole output (within the prefill/decode rounding)."""
    import json

    jsonschema = pytest.importorskip("jsonschema")
    llg = pytest.importorskip("llguidance")
    from minfer import constrain
    from minfer.batch import Engine
    from minfer.llm import LLM

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["name", "tags", "n"], "additionalProperties": False}
    path = str(layout_model("qwen2.5-coder-0.5b-instruct-q4_k_m"))
    with LLM(path, backend="cuda") as llm:
        prompt = llm.tokenize("Hello")
        out = llm.generate(prompt, max_tokens=80, json_schema=schema)
        assert out.metrics.stop_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
        sampled = llm.generate(prompt, max_tokens=80, json_schema=schema, temperature=1.0, seed=2)
        jsonschema.validate(json.loads(sampled.text), schema)
        logits = llm.logits(prompt + out.tokens)
        m = llg.LLMatcher(constrain.vocabulary(llm.tokenizer, llm.n_vocab),
                          constrain.compile_constraint("json_schema", schema).grammar)
        for i, tok in enumerate(out.tokens):
            row = logits[len(prompt) - 1 + i]
            ok = np.flatnonzero(np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")
                                [:llm.n_vocab])
            assert tok in ok and row[tok] >= row[ok].max() - 3e-2 * np.abs(row).max()
            assert m.consume_token(tok)
    with Engine(path, backend="cuda", max_sequences=4) as eng:
        hs = [eng.submit(prompt, max_tokens=80, json_schema=schema), eng.submit(prompt, max_tokens=16),
              eng.submit(prompt, max_tokens=80, json_schema=schema, temperature=1.0, seed=5)]
        outs = [h.result() for h in hs]
        for o in (outs[0], outs[2]):
            jsonschema.validate(json.loads(o.text), schema)
        assert outs[1].metrics.generated_tokens == 16
