"""The BPE tokenizer against llama.cpp's tokenizer test vectors
(../shared/fixtures/vocab) and against llama.cpp's tokenization of the fixture
strings and prompts on the real models; decoding and streaming."""
import json

import numpy as np
import pytest

from conftest import real_model, shared_path
from minfer import tokenizer as T

VECTORS = [("qwen2", "ggml-vocab-qwen2.gguf"), ("deepseek-r1-qwen", "ggml-vocab-qwen2.gguf"),
           ("gpt-2", "ggml-vocab-gpt-2.gguf"), ("llama-spm", "ggml-vocab-llama-spm.gguf"),
           ("phi-3", "ggml-vocab-phi-3.gguf")]


@pytest.mark.parametrize("name,vocab", VECTORS, ids=[v[0] for v in VECTORS])
def test_llamacpp_vectors(name, vocab):
    tok = T.from_gguf(shared_path("fixtures", "vocab", vocab))
    inp = shared_path("fixtures", "vocab", f"ggml-vocab-{name}.gguf.inp").read_text("utf-8")
    out = shared_path("fixtures", "vocab", f"ggml-vocab-{name}.gguf.out").read_text("utf-8").split("\n")
    cases = inp.split("\n__ggml_vocab_test__\n")[:-1]
    assert len(cases) == 46
    for text, expected in zip(cases, out):
        ids = [int(x) for x in expected.split()]
        assert tok.encode(text, add_special=False) == ids, repr(text)
        # streaming: the same ids fed one at a time give the text back, never a broken character
        d = T.Detokenizer(tok)
        pieces = [d.push(i) for i in ids] + [d.flush()]
        assert all("\ufffd" not in p for p in pieces)
        joined = "".join(pieces)
        if isinstance(tok, T.SPMTokenizer) and joined.startswith(" "):
            joined = joined[1:]  # the prefix space SentencePiece adds
        assert joined == text, repr(text)


MODELS = [("smollm2-135m", "smollm2-135m-instruct-q4_1"), ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m"),
          ("gemma3-270m", "gemma3-270m-q4_k_m")]  # gemma3: SentencePiece, 262k pieces, byte fallback, BOS


@pytest.mark.parametrize("model,fx", MODELS, ids=[m[0] for m in MODELS])
def test_real_model_strings(model, fx):
    tok = T.from_gguf(real_model(model))
    lines = shared_path("fixtures", "llamacpp", "tokenizer", f"{fx}.jsonl").read_text("utf-8").splitlines()
    assert len(lines) == 48
    for line in lines:
        d = json.loads(line)
        assert tok.encode(d["text"], False, parse_special=False) == d["ids_parse_special_false"], repr(d["text"])
        assert tok.encode(d["text"], False, parse_special=True) == d["ids_parse_special_true"], repr(d["text"])
        with_bos = tok.encode(d["text"], True, parse_special=False)  # the flag: BOS added or not
        assert (with_bos == d["ids_parse_special_false"]) == d["add_special_true_same"], repr(d["text"])
        # decoding gives the text back (special tokens rendered when asked), also one token at a time
        assert tok.decode(d["ids_parse_special_true"], special=True) == d["text"]
        stream = T.Detokenizer(tok, special=True)
        assert "".join([stream.push(i) for i in d["ids_parse_special_true"]] + [stream.flush()]) == d["text"]


@pytest.mark.parametrize("model,fx", MODELS, ids=[m[0] for m in MODELS])
def test_fixture_prompts(model, fx):
    tok = T.from_gguf(real_model(model))
    for p in ("a_capital", "b_paragraph", "c_chatml", "d_long"):
        text = shared_path("fixtures", "llamacpp", "prompts", f"{p}.txt").read_text("utf-8")
        ids = np.load(shared_path("fixtures", "llamacpp", "real", f"{fx}__{p}.npz"))["prompt_ids"]
        assert tok.encode(text, parse_special=True) == ids.tolist(), p


def test_eog_and_special_types():
    tok = T.from_gguf(shared_path("fixtures", "vocab", "ggml-vocab-qwen2.gguf"))
    assert {151643, 151645, 151662, 151663, 151664, 128247} <= tok.special.eog
    assert tok.encode("<|im_start|>hi", parse_special=False) != tok.encode("<|im_start|>hi", parse_special=True)
    assert tok.encode("<|im_start|>", parse_special=True) == [151644]
    # user content never becomes a control token, but user-defined tokens always match
    assert tok.encode("<tool_call>", parse_special=False) == [151657]


def test_streaming_never_splits_a_character():
    tok = T.from_gguf(shared_path("fixtures", "vocab", "ggml-vocab-qwen2.gguf"))
    text = "naïve café 🦙 日本語 ok"
    ids = tok.encode(text)
    d = T.Detokenizer(tok)
    pieces = [d.push(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == text
    for p in pieces:
        assert "\ufffd" not in p
    # a byte-level token that is half of a character yields nothing until the rest arrives
    llama = [i for i in ids if tok.token_bytes(i) and not tok.token_bytes(i).decode("utf-8", "ignore")]
    assert llama, "the emoji is split over byte tokens in this vocabulary"


@pytest.mark.parametrize("vocab", ["ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf"])
def test_byte_level_token_bytes(vocab):
    """Every normal token's bytes (read from the table made at load) are its characters mapped through the
    byte-level alphabet one by one, a character outside it as "?"; reading them grows nothing."""
    tok = T.from_gguf(shared_path("fixtures", "vocab", vocab))
    _, char_to_byte = T.byte_map()
    before = {k: len(v) for k, v in vars(tok).items() if hasattr(v, "__len__")}
    for i, t in enumerate(tok.tokens):
        if tok.types[i] == T.NORMAL:
            assert tok.token_bytes(i) == bytes(char_to_byte.get(c, ord("?")) for c in t), i
    assert {k: len(v) for k, v in vars(tok).items() if hasattr(v, "__len__")} == before


def test_special_tokens_in_text_as_llamacpp():
    """Text with special tokens in it, parsed (a chat prompt's way), against llama.cpp's llama-tokenize on four
    vocabularies (tests/fixtures/tokenizer_specials.json): SentencePiece prefixes a space to the text after
    every special token, <unk> is special too, and Phi-3's special tokens (but <s>, <unk>, <|endoftext|>)
    swallow the whitespace after them."""
    from pathlib import Path

    fx = json.loads((Path(__file__).parent / "fixtures" / "tokenizer_specials.json").read_text())
    for vocab, rows in fx["cases"].items():
        tok = T.from_gguf(shared_path("fixtures", "vocab", vocab))
        for row in rows:
            assert tok.encode(row["text"], add_special=True, parse_special=True) == row["ids"], (vocab, row["text"])
