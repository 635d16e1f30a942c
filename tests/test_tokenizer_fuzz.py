"""Seeded random fuzzing of the tokenizers (issue 8): arbitrary text must encode
without error and decode back to itself (byte-level BPE is lossless; SentencePiece
with byte fallback is too); arbitrary id sequences decode,
and streaming them gives the same text as decoding them at once."""
import random

import pytest

from conftest import shared_path
from minfer import tokenizer as T

VOCABS = ["ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"]

# Character classes that stress pre-tokenizer regexes, merges and byte fallback.
ALPHABETS = [
    "abcxyzABCXYZ", "0123456789", " \t\n\r\x0b\x0c\u00a0\u2009\u3000", ".,;:!?'\"`-_()[]{}<>/\\|@#$%^&*+=~",
    "éüßçñøÅ", "дифЖЯ", "中文字符日本語한국어", "😀🚀👍🏽👨‍👩‍👧", "\u0301\u0308\u200d\ufe0f", "\x00\x01\x1f\x7f",
    "<|im_start|><|endoftext|></s><s>",  # special-token texts appear as plain text unless parse_special
    "'s're've'll'd'm't", "\U0001f600\U00010348\U000e0001",
]


def random_text(r: random.Random) -> str:
    parts = []
    for _ in range(r.randint(1, 12)):
        a = r.choice(ALPHABETS)
        parts.append("".join(r.choice(a) for _ in range(r.randint(1, 8))))
    return "".join(parts)


@pytest.mark.parametrize("vocab", VOCABS)
def test_random_text_round_trips(vocab):
    tok = T.from_gguf(shared_path("fixtures", "vocab", vocab))
    r = random.Random(hash(vocab) & 0xFFFF)
    for _ in range(150):
        text = random_text(r)
        ids = tok.encode(text, add_special=False)
        assert all(0 <= i < tok.n_vocab for i in ids)
        assert tok.decode(ids) == text, repr(text)  # SPM: decode drops the prefix space encode added


@pytest.mark.parametrize("vocab", VOCABS)
def test_random_ids_decode_and_stream_alike(vocab):
    tok = T.from_gguf(shared_path("fixtures", "vocab", vocab))
    r = random.Random(7)
    for _ in range(200):
        ids = [r.randrange(tok.n_vocab) for _ in range(r.randint(1, 20))]
        for special in (False, True):
            whole = tok.decode(ids, special=special)
            d = T.Detokenizer(tok, special=special)
            streamed = "".join(d.push(i) for i in ids) + d.flush()
            if isinstance(tok, T.SPMTokenizer) and tok.add_space_prefix and streamed.startswith(" "):
                streamed = streamed[1:]
            assert streamed == whole, ids


@pytest.mark.parametrize("vocab", VOCABS)
def test_hostile_ids_and_text_raise_clear_errors(vocab):
    tok = T.from_gguf(shared_path("fixtures", "vocab", vocab))
    for bad in (-1, tok.n_vocab, 2**40):
        with pytest.raises(T.TokenizerError, match="out of range"):
            tok.decode([1, bad])
    # a lone surrogate cannot be UTF-8: a ValueError naming the problem, not a crash deep inside
    with pytest.raises(ValueError, match="surrogate"):
        tok.encode("ok \ud800 ok")
    assert tok.encode("", add_special=False) == []


def test_sentencepiece_cut_merges_as_the_whole_text():
    """Gemma 3's SentencePiece vocabulary (262k pieces, byte fallback): the text is merged in pieces cut where
    no merge can cross (its one crossing piece, ">\u2581</", kept whole); random texts full of ">" and " </"
    give the tokens of merging the whole text at once, and decode back to themselves."""
    from conftest import real_model

    tok = T.from_gguf(real_model("gemma3-270m"))
    r = random.Random(3)
    pieces = [">", " </", " </s>", "<", " ", "  ", "a", "é", "中", "\n", "x>", ">  </", "😀"]
    for _ in range(300):
        text = "".join(r.choice(pieces) for _ in range(r.randint(1, 40))) if r.random() < 0.7 else random_text(r)
        spaced = text.replace(" ", tok.SPACE)
        assert tok._spm(spaced) == list(tok._spm_piece.__wrapped__(tok, spaced)), repr(text)
        assert tok.decode(tok.encode(text, add_special=False)) == text, repr(text)
