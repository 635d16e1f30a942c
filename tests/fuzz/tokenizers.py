"""The long tokenizer fuzz run (CI runs a short one: tests/test_tokenizer_fuzz.py): for MINUTES, random
texts from the test's alphabets through every vocabulary there is here (the four fixture vocabularies and,
where downloaded, gemma3-270m's SentencePiece) must encode without error, decode back to themselves, and
stream-decode like a whole decode; each encode is timed, and one slower than 2 s counts as a hang.

    PYTHONPATH=python python tests/fuzz/tokenizers.py [MINUTES] [SEED]      (default 10 minutes, seed 1)

Prints the counts per vocabulary and exits 1 on the first failure, with the text that caused it."""
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import shared_path  # noqa: E402
from test_tokenizer_fuzz import VOCABS, random_text  # noqa: E402

from minfer import hub, tokenizer as T  # noqa: E402


def vocabularies():
    out = {v: shared_path("fixtures", "vocab", v) for v in VOCABS}
    gemma = hub.cache_dir() / "gemma3-270m-q4_k_m.gguf"
    if gemma.exists():
        out["gemma3-270m"] = gemma
    return {name: T.from_gguf(str(path)) for name, path in out.items() if Path(path).exists()}


def main(minutes: float, seed: int) -> int:
    toks = vocabularies()
    r = random.Random(seed)
    counts = dict.fromkeys(toks, 0)
    deadline = time.monotonic() + 60 * minutes
    while time.monotonic() < deadline:
        name = r.choice(sorted(toks))
        tok = toks[name]
        text = random_text(r) if r.random() < 0.8 else "".join(random_text(r) for _ in range(r.randint(2, 30)))
        t0 = time.monotonic()
        ids = tok.encode(text, add_special=False)
        if time.monotonic() - t0 > 2.0:
            print(f"FAIL {name}: encoding {len(text)} characters took {time.monotonic() - t0:.1f} s: {text!r}")
            return 1
        if tok.decode(ids) != text:
            print(f"FAIL {name}: round trip: {text!r} -> {ids}")
            return 1
        d = T.Detokenizer(tok)
        streamed = "".join(d.push(i) for i in ids) + d.flush()
        if isinstance(tok, T.SPMTokenizer) and tok.add_space_prefix and streamed.startswith(" "):
            streamed = streamed[1:]
        if streamed != text:
            print(f"FAIL {name}: streamed decode: {text!r} -> {streamed!r}")
            return 1
        counts[name] += 1
    for name, n in counts.items():
        print(f"{name}: {n} texts")
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0, int(sys.argv[2]) if len(sys.argv) > 2 else 1))
