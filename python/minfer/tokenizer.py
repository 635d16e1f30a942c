"""Tokenizers built from a GGUF file's own vocabulary.

Byte-level BPE (`tokenizer.ggml.model = gpt2`) with the pre-tokenizers that
`tokenizer.ggml.pre` names.  Text -> ids in four steps:

  1. special tokens: the text is cut at the vocabulary's special tokens.  User-
     defined tokens (e.g. Qwen's <tool_call>) are always recognised; control
     tokens (<|im_start|>, ...) only when parse_special=True, which chat
     templates ask for and user content never does;
  2. pre-tokenization: each remaining span is split into words by the regexes
     of its pre-tokenizer (applied in sequence: each splits the pieces of the
     previous one, keeping both the matches and the text between them);
  3. bytes -> symbols: every byte of a word becomes one printable character
     (the GPT-2 byte map), so BPE never sees an unknown character;
  4. merges: adjacent symbols are merged, lowest merge rank first, until no
     ranked pair remains; each final symbol is a token.

Decoding maps the symbols back to bytes; `Detokenizer` does it incrementally and
never emits half of a UTF-8 character.
"""
from __future__ import annotations

import array
import functools
import heapq
import itertools
import re
from dataclasses import dataclass

import regex

from . import gguf as gguf_mod

# token types in tokenizer.ggml.token_type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
PRE_TOKENIZERS = {
    # Qwen2 / Qwen2.5 / DeepSeek-R1-distill-Qwen: single digits, letters with one leading non-letter
    "qwen2": [_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    # Llama 3: as qwen2 with digits in runs of up to three
    "llama-bpe": [_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    # SmolLM: every digit alone, then GPT-2's rules
    "smollm": [r"\p{N}", _GPT2],
    "gpt-2": [_GPT2],
}
PRE_TOKENIZERS["deepseek-r1-qwen"] = PRE_TOKENIZERS["qwen2"]
PRE_TOKENIZERS["llama3"] = PRE_TOKENIZERS["llama-bpe"]
# "default": llama.cpp's fallback for unknown names (GPT-2-like, with digit runs of 1-3)
PRE_TOKENIZERS["default"] = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# Vocabularies that mark these end-of-turn/end-of-text tokens as normal text are
# wrong; like llama.cpp we treat them as control tokens (and as end of generation).
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
             "<EOT>", "<|end_of_text|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}


class TokenizerError(ValueError):
    pass


@functools.lru_cache(maxsize=1)
def byte_map() -> tuple[dict, dict]:
    """GPT-2's bijection between bytes and printable characters (byte -> char, char -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars, {c: b for b, c in chars.items()}


@dataclass
class Special:
    eog: frozenset      # end-of-generation ids
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool


class _Vocabulary:
    """What both tokenizer kinds read from the GGUF: the tokens and their types, the
    special ids (BOS/EOS/end-of-generation), and the special-token splitters."""

    def _load_vocabulary(self, meta: dict, add_bos_default: bool) -> None:
        self.tokens: list[str] = meta["tokenizer.ggml.tokens"]
        self.types: list[int] = list(meta.get("tokenizer.ggml.token_type", [NORMAL] * len(self.tokens)))
        for i, t in enumerate(self.tokens):  # as llama.cpp: control whatever the file says (Gemma's "</s>" is
            if t in EOG_TEXTS and self.types[i] != CONTROL:  # user-defined there, so never matched in plain text)
                self.types[i] = CONTROL
        self.vocab = {t: i for i, t in enumerate(self.tokens)}

        def pick(key):
            v = meta.get(key)
            return int(v) if v is not None and 0 <= int(v) < len(self.tokens) else None
        eog = {i for i, t in enumerate(self.tokens) if t in EOG_TEXTS}
        eos, eot = pick("tokenizer.ggml.eos_token_id"), pick("tokenizer.ggml.eot_token_id")
        eog |= {i for i in (eos, eot) if i is not None}
        self.special = Special(frozenset(eog), pick("tokenizer.ggml.bos_token_id"), eos,
                               bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
                               bool(meta.get("tokenizer.ggml.add_eos_token", False)))
        specials = [(t, i) for i, t in enumerate(self.tokens) if self.types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and t]
        specials.sort(key=lambda ti: -len(ti[0]))  # longest first, so no token cuts a longer one
        self._special_all = self._special_re([t for t, _ in specials])
        self._special_user = self._special_re([t for t, i in specials if self.types[i] == USER_DEFINED])
        # Phi-3's special tokens swallow the whitespace after them, as llama.cpp sets for models of that name
        # (its </s> too; not <unk>, <s>, <|endoftext|>)
        phi3 = any(n in str(meta.get("general.name", "")).lower() for n in ("phi-3", "phi3"))
        self._rstrip = ({t for t, _ in specials} | {"</s>"}) - {"<unk>", "<s>", "<|endoftext|>"} if phi3 else set()

    @staticmethod
    def _special_re(texts):
        return regex.compile("(" + "|".join(regex.escape(t) for t in texts) + ")") if texts else None

    def _split_special(self, text: str, parse_special: bool) -> list[str]:
        """Text pieces alternating with special-token texts (odd indices)."""
        splitter = self._special_all if parse_special else self._special_user
        pieces = splitter.split(text) if splitter else [text]
        for k in range(1, len(pieces) - 1, 2):
            if pieces[k] in self._rstrip:
                pieces[k + 1] = pieces[k + 1].lstrip(" \t\n\v\f\r")
        return pieces

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def decode(self, ids, special: bool = False) -> str:
        return b"".join(self.token_bytes(int(i), special) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer(_Vocabulary):
    def __init__(self, meta: dict):
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(f"tokenizer model {model!r} is not supported yet (byte-level BPE 'gpt2' is)")
        self._load_vocabulary(meta, add_bos_default=False)
        merges = meta.get("tokenizer.ggml.merges", [])
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.pre = meta.get("tokenizer.ggml.pre", "default")
        if self.pre not in PRE_TOKENIZERS:
            raise TokenizerError(f"pre-tokenizer {self.pre!r} is not supported ({', '.join(sorted(PRE_TOKENIZERS))})")
        self.ignore_merges = self.pre in ("llama-bpe", "llama3")  # whole words in the vocab win
        self.regexes = [regex.compile(r) for r in PRE_TOKENIZERS[self.pre]]
        self.byte_to_char, self.char_to_byte = byte_map()
        self._byte_table()

    # -- encoding ---------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = []
        if add_special and self.special.add_bos and self.special.bos is not None:
            ids.append(self.special.bos)
        for k, piece in enumerate(self._split_special(text, parse_special)):
            if k % 2 == 1:  # a special token matched by the splitter's group
                ids.append(self.vocab[piece])
            elif piece:
                for word in self._pre_tokenize(piece):
                    ids.extend(self._bpe_word(word))
        if add_special and self.special.add_eos and self.special.eos is not None:
            ids.append(self.special.eos)
        return ids

    def _pre_tokenize(self, text: str) -> list[str]:
        words = [text]
        for rx in self.regexes:
            out = []
            for w in words:
                pos = 0
                for m in rx.finditer(w):
                    if m.start() > pos:
                        out.append(w[pos:m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(w):
                    out.append(w[pos:])
            words = out
        return words

    @functools.lru_cache(maxsize=65536)
    def _bpe_word(self, word: str) -> tuple[int, ...]:
        sym = "".join(self.byte_to_char[b] for b in word.encode("utf-8"))
        if self.ignore_merges and sym in self.vocab:
            return (self.vocab[sym],)
        parts = list(sym)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            a, b = parts[best], parts[best + 1]
            merged, i = [], 0
            while i < len(parts):  # merge every occurrence of the pair, left to right
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        out = []
        for p in parts:
            if p in self.vocab:
                out.append(self.vocab[p])
            else:  # a symbol the vocabulary lacks: fall back to its single bytes
                out.extend(self.vocab[c] for c in p if c in self.vocab)
        return tuple(out)

    # -- decoding ---------------------------------------------------------------
    def token_bytes(self, tok: int, special: bool = False) -> bytes:
        """The bytes of one token; control tokens render as their text only if `special`."""
        if tok < 0 or tok >= len(self.tokens):
            raise TokenizerError(f"token id {tok} is out of range [0, {len(self.tokens)})")
        t, ty = self.tokens[tok], self.types[tok]
        if ty in (CONTROL, UNUSED, UNKNOWN):
            return t.encode() if special else b""
        if ty == USER_DEFINED:
            return t.encode()
        return self._blob[self._ends[tok - 1] if tok else 0:self._ends[tok]]

    def _byte_table(self) -> None:
        """Every token's bytes in one blob, token i at _blob[_ends[i - 1]:_ends[i]] (characters the byte-level
        alphabet lacks as "?"): made at load in a few ms and fixed from then on, where a cache filled as tokens
        were first decoded grew a long-running server's memory with every new token it sampled."""
        table = {c: "?" for c in range(256)}
        table.update({ord(c): chr(b) for c, b in self.char_to_byte.items()})
        self._blob = "".join(self.tokens).translate(table).encode("latin-1", errors="replace")
        self._ends = array.array("q", itertools.accumulate(len(t) for t in self.tokens))


class Detokenizer:
    """Incremental decoding for streaming: push(token) returns the new text that
    is complete UTF-8; a character split across tokens waits for its last byte."""

    def __init__(self, tok: BPETokenizer, special: bool = False):
        self.tok, self.special, self.pending = tok, special, b""

    def push(self, token: int) -> str:
        self.pending += self.tok.token_bytes(token, self.special)
        cut = _complete_prefix(self.pending)
        text, self.pending = self.pending[:cut], self.pending[cut:]
        return text.decode("utf-8", errors="replace")

    def flush(self) -> str:
        text, self.pending = self.pending, b""
        return text.decode("utf-8", errors="replace")


def _complete_prefix(b: bytes) -> int:
    """Length of the longest prefix that does not end inside a UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c & 0xC0 == 0x80:      # continuation byte: keep looking for the lead byte
            continue
        if c & 0x80 == 0:         # ASCII
            return n
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


class SPMTokenizer(_Vocabulary):
    """SentencePiece-style vocabularies (`tokenizer.ggml.model = llama`): spaces
    become U+2581, a space is prepended, and adjacent pieces merge highest score
    first (leftmost on ties) while the merged piece is in the vocabulary;
    characters left without a token fall back to their <0xXX> byte tokens."""

    SPACE = "\u2581"

    def __init__(self, meta: dict):
        if meta.get("tokenizer.ggml.model") != "llama":
            raise TokenizerError("SPMTokenizer needs tokenizer.ggml.model = 'llama'")
        self._load_vocabulary(meta, add_bos_default=True)
        self.scores = meta.get("tokenizer.ggml.scores", [0.0] * len(self.tokens))
        self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        self.byte_tokens = {b: self.vocab.get(f"<0x{b:02X}>") for b in range(256)}
        self.unk = meta.get("tokenizer.ggml.unknown_token_id", 0)
        # A merge never crosses a U+2581 that follows another character unless some token holds that character
        # before a U+2581 (Gemma's ">▁</"): the text is cut at every other such place and each piece merged
        # alone (and cached) -- the tokens of merging the whole text at once, without its cost.
        joined = set(re.findall(f"([^{self.SPACE}]){self.SPACE}", "\x00".join(self.tokens)))
        self._cut = re.compile(f"(?<=[^{self.SPACE}{''.join(re.escape(c) for c in sorted(joined))}])(?={self.SPACE})")

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = []
        if add_special and self.special.add_bos and self.special.bos is not None:
            ids.append(self.special.bos)
        after_special = True  # the text at the start, and after each special token, gets the space prefix
        for k, piece in enumerate(self._split_special(text, parse_special)):
            if k % 2 == 1:
                ids.append(self.vocab[piece])
                after_special = True
            elif piece:
                if self.add_space_prefix and after_special:
                    piece = " " + piece
                ids.extend(self._spm(piece.replace(" ", self.SPACE)))
                after_special = False
        if add_special and self.special.add_eos and self.special.eos is not None:
            ids.append(self.special.eos)
        return ids

    def _spm(self, text: str) -> list[int]:
        out = []
        for piece in self._cut.split(text):
            out.extend(self._spm_piece(piece))
        return out

    @functools.lru_cache(maxsize=65536)
    def _spm_piece(self, text: str) -> tuple[int, ...]:
        sym = list(text)
        prev = list(range(-1, len(sym) - 1))
        nxt = list(range(1, len(sym) + 1))
        nxt[-1] = -1
        heap = []

        def push(i, j):
            t = self.vocab.get(sym[i] + sym[j])
            if t is not None:
                heapq.heappush(heap, (-self.scores[t], i, j, sym[i] + sym[j]))
        for i in range(len(sym) - 1):
            push(i, i + 1)
        while heap:
            _, i, j, text_ij = heapq.heappop(heap)
            if not sym[i] or not sym[j] or sym[i] + sym[j] != text_ij or nxt[i] != j:
                continue  # stale: one side was merged away since
            sym[i], sym[j] = text_ij, ""
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prev[nxt[j]] = i
            if prev[i] >= 0:
                push(prev[i], i)
            if nxt[i] >= 0:
                push(i, nxt[i])
        out, i = [], 0
        while i != -1 and i < len(sym):
            piece = sym[i]
            t = self.vocab.get(piece)
            if t is not None:
                out.append(t)
            else:
                out.extend(self.byte_tokens.get(b) if self.byte_tokens.get(b) is not None else self.unk
                           for b in piece.encode("utf-8"))
            i = nxt[i]
        return tuple(out)

    def token_bytes(self, tok: int, special: bool = False) -> bytes:
        if tok < 0 or tok >= len(self.tokens):
            raise TokenizerError(f"token id {tok} is out of range [0, {len(self.tokens)})")
        t, ty = self.tokens[tok], self.types[tok]
        if ty == BYTE:
            return bytes([int(t[3:5], 16)])
        if ty in (CONTROL, UNUSED, UNKNOWN):
            return t.encode() if special else b""
        return t.replace(self.SPACE, " ").encode()

    def decode(self, ids, special: bool = False) -> str:
        text = super().decode(ids, special)
        return text[1:] if self.add_space_prefix and text.startswith(" ") else text


def from_gguf(path_or_file) -> BPETokenizer | SPMTokenizer:
    f = path_or_file if isinstance(path_or_file, gguf_mod.GGUFFile) else gguf_mod.open(path_or_file)
    model = f.metadata.get("tokenizer.ggml.model")
    return SPMTokenizer(f.metadata) if model == "llama" else BPETokenizer(f.metadata)
