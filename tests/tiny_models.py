"""Small models whose logits llama.cpp computed for the fixtures in tests/fixtures/ (their READMEs say how):
a 512-piece SentencePiece vocabulary (3 specials, 256 byte pieces, letter pieces), hidden 256 (IQ4_XS
rows are multiples of 256), 4 heads of 64, 2 KV heads, FFN 512.  Weights are numpy's seeded normal draws:
matrices std 0.02, q and k 0.1 (so attention depends on position), norms 1 +- 0.05.

    python tests/tiny_models.py llama-f32 OUT.gguf     the float32 llama that iq4-mix.gguf was quantized from
    python tests/tiny_models.py gemma3-q8_0 OUT.gguf   a 6-layer gemma3 (5 local layers, window 16, RoPE
                                                       scaling, softcap)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_writer import ARR, BOOL, F32, I32, STR, U32, build_gguf, f32_tensor  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 256, 4, 2, 64, 512, 512
GEMMA_WINDOW = 16


def vocab_kv():
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [a + b for a in "etaoinsr" for b in letters]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581" + c for c in letters] + list(letters)
    pieces += (["\u2581" + p for p in pairs] + pairs)[:VOCAB - len(pieces)]
    types = [2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259)  # unknown, control, byte, normal
    scores = [0.0] * 259 + [-float(i) for i in range(VOCAB - 259)]
    assert len(pieces) == VOCAB and len(set(pieces)) == VOCAB
    return [("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, pieces, STR),
            ("tokenizer.ggml.scores", ARR, scores, F32), ("tokenizer.ggml.token_type", ARR, types, I32),
            ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0)]


def q8_0_tensor(name: str, arr: np.ndarray):
    """ggml's reference Q8_0 quantizer (minfer's, checked bit for bit against ggml in test_quantize)."""
    from minfer.quants import GGMLType, quantize

    a = np.ascontiguousarray(arr, dtype=np.float32)
    return (name, int(GGMLType.Q8_0), list(reversed(a.shape)), quantize(a.reshape(-1), GGMLType.Q8_0).tobytes())


def llama_f32(out: str, extra: dict | None = None, context: int = 2048) -> None:
    """extra: more llama.* keys (str or float values), for tests of how they are read; context: the trained
    context length."""
    rng = np.random.default_rng(0)
    mat = lambda rows, cols, std=0.02: rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(std)  # noqa: E731
    norm = lambda n: (1 + 0.05 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    layers = 2
    kv = [("general.architecture", STR, "llama"), ("general.name", STR, "minfer-iquants-source"),
          ("llama.context_length", U32, context), ("llama.embedding_length", U32, HIDDEN),
          ("llama.block_count", U32, layers), ("llama.feed_forward_length", U32, FFN),
          ("llama.attention.head_count", U32, HEADS), ("llama.attention.head_count_kv", U32, KV_HEADS),
          ("llama.rope.dimension_count", U32, HEAD_DIM), ("llama.rope.freq_base", F32, 10000.0),
          ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5), ("general.file_type", U32, 0)] + vocab_kv()
    kv += [("llama." + k, STR if isinstance(v, str) else F32, v) for k, v in (extra or {}).items()]
    t = [f32_tensor("token_embd.weight", mat(VOCAB, HIDDEN, 1.0))]
    for i in range(layers):
        b = f"blk.{i}."
        t += [f32_tensor(b + "attn_norm.weight", norm(HIDDEN)),
              f32_tensor(b + "attn_q.weight", mat(HEADS * HEAD_DIM, HIDDEN, 0.1)),
              f32_tensor(b + "attn_k.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN, 0.1)),
              f32_tensor(b + "attn_v.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN)),
              f32_tensor(b + "attn_output.weight", mat(HIDDEN, HEADS * HEAD_DIM)),
              f32_tensor(b + "ffn_norm.weight", norm(HIDDEN)),
              f32_tensor(b + "ffn_gate.weight", mat(FFN, HIDDEN)),
              f32_tensor(b + "ffn_up.weight", mat(FFN, HIDDEN)),
              f32_tensor(b + "ffn_down.weight", mat(HIDDEN, FFN))]
    t += [f32_tensor("output_norm.weight", norm(HIDDEN)), f32_tensor("output.weight", mat(VOCAB, HIDDEN, 0.05))]
    Path(out).write_bytes(build_gguf(kv, t).data)


def gemma3_q8_0(out: str, chat_template: str | None = None) -> None:
    """Six layers so that gemma's pattern (every sixth layer global) has both kinds; a 16-token window so
    that prompts of 48 and 200 tokens reach past it; the global layer's RoPE scaled linearly by 8 (as in
    gemma3 4B+; base 1e4 so that it matters at these lengths); embeddings (tied with the output) of std 0.05,
    so the sqrt(256) embedding scale gives a residual of about unit size; final-logit softcap 5 (logits of ~1
    bend visibly).  numpy's legacy RandomState: its stream is frozen, so the file is the same on every machine."""
    rng = np.random.RandomState(1)
    mat = lambda rows, cols, std=0.02: rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(std)  # noqa: E731
    norm = lambda n: (1 + 0.05 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    layers, g = 6, "gemma3."
    kv = [("general.architecture", STR, "gemma3"), ("general.name", STR, "minfer-tiny-gemma3"),
          (g + "context_length", U32, 2048), (g + "embedding_length", U32, HIDDEN),
          (g + "block_count", U32, layers), (g + "feed_forward_length", U32, FFN),
          (g + "attention.head_count", U32, HEADS), (g + "attention.head_count_kv", U32, KV_HEADS),
          (g + "attention.key_length", U32, HEAD_DIM), (g + "attention.value_length", U32, HEAD_DIM),
          (g + "rope.freq_base", F32, 1e4), (g + "attention.sliding_window", U32, GEMMA_WINDOW),
          (g + "rope.scaling.type", STR, "linear"), (g + "rope.scaling.factor", F32, 8.0),
          (g + "attention.layer_norm_rms_epsilon", F32, 1e-6), (g + "final_logit_softcapping", F32, 5.0),
          ("general.file_type", U32, 7), ("tokenizer.ggml.add_bos_token", BOOL, True)] + vocab_kv()
    if chat_template is not None:
        kv.append(("tokenizer.chat_template", STR, chat_template))
    t = [q8_0_tensor("token_embd.weight", mat(VOCAB, HIDDEN, 0.05))]
    for i in range(layers):
        b = f"blk.{i}."
        t += [f32_tensor(b + "attn_norm.weight", norm(HIDDEN)),
              q8_0_tensor(b + "attn_q.weight", mat(HEADS * HEAD_DIM, HIDDEN, 0.1)),
              q8_0_tensor(b + "attn_k.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN, 0.1)),
              q8_0_tensor(b + "attn_v.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN)),
              f32_tensor(b + "attn_q_norm.weight", norm(HEAD_DIM)),
              f32_tensor(b + "attn_k_norm.weight", norm(HEAD_DIM)),
              q8_0_tensor(b + "attn_output.weight", mat(HIDDEN, HEADS * HEAD_DIM)),
              f32_tensor(b + "post_attention_norm.weight", norm(HIDDEN)),
              f32_tensor(b + "ffn_norm.weight", norm(HIDDEN)),
              q8_0_tensor(b + "ffn_gate.weight", mat(FFN, HIDDEN)),
              q8_0_tensor(b + "ffn_up.weight", mat(FFN, HIDDEN)),
              q8_0_tensor(b + "ffn_down.weight", mat(HIDDEN, FFN)),
              f32_tensor(b + "post_ffw_norm.weight", norm(HIDDEN))]
    t += [f32_tensor("output_norm.weight", norm(HIDDEN))]
    Path(out).write_bytes(build_gguf(kv, t).data)


def gemma3_forward_f64(path: str, ids) -> np.ndarray:
    """Logits of every position of `ids` by the tiny gemma3 model, in float64 numpy from the definition (the
    weights dequantized by minfer.quants.dequantize, itself checked against the gguf package): an independent
    reference for the engine's arithmetic, slow but exact.  Five of six layers local (window 16, RoPE base
    1e4); the global layer's positions scaled by 1/8; softcap 5."""
    import minfer
    from minfer.quants import dequantize

    f = minfer.gguf.open(path)
    W = {}
    for name, info in f.tensors.items():
        raw = np.ascontiguousarray(np.asarray(info.data).view(np.uint8)).reshape(-1)
        W[name] = dequantize(raw, info.type).astype(np.float64)
    f.close()
    H, hd, T = HIDDEN, HEAD_DIM, len(ids)
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w  # noqa: E731
    mat = lambda name, rows: W[name].reshape(rows, -1)  # noqa: E731

    def rope(x, pos):  # NeoX halves, base 1e4
        half = hd // 2
        ang = pos[:, None] * 1e4 ** (-np.arange(half) * 2.0 / hd)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)

    E = mat("token_embd.weight", VOCAB)
    x = E[np.asarray(ids)] * np.sqrt(H)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    for layer in range(6):
        p, local = f"blk.{layer}.", layer % 6 < 5
        pos = np.arange(T, dtype=np.float64) * (1.0 if local else 0.125)
        h = rms(x, W[p + "attn_norm.weight"])
        q = rms((h @ mat(p + "attn_q.weight", HEADS * hd).T).reshape(T, HEADS, hd), W[p + "attn_q_norm.weight"])
        k = rms((h @ mat(p + "attn_k.weight", KV_HEADS * hd).T).reshape(T, KV_HEADS, hd), W[p + "attn_k_norm.weight"])
        v = (h @ mat(p + "attn_v.weight", KV_HEADS * hd).T).reshape(T, KV_HEADS, hd)
        q, k = rope(q, pos) / np.sqrt(hd), rope(k, pos)
        seen = (j <= i) & ((i - j < GEMMA_WINDOW) if local else True)
        o = np.zeros((T, HEADS, hd))
        for head in range(HEADS):
            g = head // (HEADS // KV_HEADS)
            s = np.where(seen, q[:, head] @ k[:, g].T, -np.inf)
            e = np.exp(s - s.max(1, keepdims=True))
            o[:, head] = (e / e.sum(1, keepdims=True)) @ v[:, g]
        x = x + rms(o.reshape(T, -1) @ mat(p + "attn_output.weight", H).T, W[p + "post_attention_norm.weight"])
        h = rms(x, W[p + "ffn_norm.weight"])
        a, u = h @ mat(p + "ffn_gate.weight", FFN).T, h @ mat(p + "ffn_up.weight", FFN).T
        gelu = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
        x = x + rms((gelu * u) @ mat(p + "ffn_down.weight", H).T, W[p + "post_ffw_norm.weight"])
    logits = rms(x, W["output_norm.weight"]) @ E.T
    return 5.0 * np.tanh(logits / 5.0)


MODELS = {"llama-f32": llama_f32, "gemma3-q8_0": gemma3_q8_0}

if __name__ == "__main__":
    MODELS[sys.argv[1]](sys.argv[2])
