"""Writes the fuzzer's seed corpus: small valid GGUF files (a tiny llama model
with every tensor the loader checks, a file with every metadata type, a split
shard) built with the tests' own writer.  python tests/fuzz/make_seeds.py DIR"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gguf_writer import ARR, BOOL, F32, F64, I8, I16, I32, I64, STR, U8, U16, U32, U64, build_gguf, f32_tensor  # noqa


def tiny_llama(E=8, H=2, ctx=64):
    F, V = 16, 12
    kv = [("general.architecture", STR, "llama"), ("llama.block_count", U32, 1), ("llama.embedding_length", U32, E),
          ("llama.feed_forward_length", U32, F), ("llama.attention.head_count", U32, H),
          ("llama.attention.head_count_kv", U32, 1), ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
          ("llama.rope.freq_base", F32, 10000.0), ("llama.context_length", U32, ctx),
          ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.tokens", ARR, [chr(97 + i) for i in range(V)], STR)]
    r = np.random.default_rng(0)
    t = lambda name, *shape: f32_tensor(name, r.standard_normal(shape).astype(np.float32))
    tensors = [t("token_embd.weight", V, E), t("output_norm.weight", E), t("blk.0.attn_norm.weight", E),
               t("blk.0.attn_q.weight", E, E), t("blk.0.attn_k.weight", E // H, E), t("blk.0.attn_v.weight", E // H, E),
               t("blk.0.attn_output.weight", E, E), t("blk.0.ffn_norm.weight", E), t("blk.0.ffn_gate.weight", F, E),
               t("blk.0.ffn_up.weight", F, E), t("blk.0.ffn_down.weight", E, F)]
    return build_gguf(kv, tensors).data


def every_type():
    kv = [("a", U8, 1), ("b", I8, -1), ("c", U16, 2), ("d", I16, -2), ("e", U32, 3), ("f", I32, -3), ("g", F32, 0.5),
          ("h", BOOL, True), ("i", STR, "s"), ("j", U64, 4), ("k", I64, -4), ("l", F64, 0.25),
          ("m", ARR, [(U8, [1, 2]), (STR, ["x"])], ARR), ("general.alignment", U32, 64)]
    return build_gguf(kv, [f32_tensor("t", np.ones((2, 4)))], alignment=64).data


def shard():
    return build_gguf([("split.count", U16, 1), ("split.no", U16, 0)], [f32_tensor("x", np.ones(3))], version=2).data


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, data in [("tiny_llama.gguf", tiny_llama()), ("every_type.gguf", every_type()), ("shard_v2.gguf", shard())]:
        (out / name).write_bytes(data)
