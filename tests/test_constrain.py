"""Constrained decoding (minfer.constrain): the token mask in the sampler and the argmax, the grammar compiled
before any work, and real models whose every output parses and validates."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import minfer
from minfer import _minfer as M

from constrain_schemas import SCHEMAS

llg = pytest.importorskip("llguidance", reason="constrained decoding needs the llguidance extra")
jsonschema = pytest.importorskip("jsonschema")

from minfer import chat, constrain, engine, gguf  # noqa: E402
from minfer import tokenizer as tokenizer_mod  # noqa: E402
from minfer.batch import Engine  # noqa: E402
from minfer.llm import LLM  # noqa: E402


def bits(allowed, n):
    """A mask of words with the bits of `allowed` set (the independent way: one token at a time)."""
    w = np.zeros((n + 31) // 32, np.uint32)
    for t in allowed:
        w[t // 32] |= np.uint32(1 << (t % 32))
    return w


def allowed_ids(mask: bytes, n: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little")[:n])


# -- the sampler and the argmax ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [31, 32, 1000, 151936])
def test_greedy_takes_the_best_allowed_token(n, rng):
    x = rng.standard_normal(n).astype(np.float32)
    for allowed in ([0], [n - 1], sorted(rng.choice(n, size=min(n, 7), replace=False).tolist()),
                    list(range(0, n, 2))):
        mask = bits(allowed, n)
        want = allowed[int(np.argmax(x[allowed]))]
        assert M.Sampler(n).sample(x, mask) == want
        assert M.Sampler(n, logit_bias={allowed[0]: -0.5}, repeat_penalty=1.1).sample(x, mask) in allowed
    full = np.full((n + 31) // 32, 0xFFFFFFFF, np.uint32)  # bits past n are ignored
    assert M.Sampler(n).sample(x, full) == int(np.argmax(x))


def test_sampled_tokens_follow_the_renormalized_softmax(rng):
    n, draws = 200, 6000
    x = rng.standard_normal(n).astype(np.float32) * 2
    allowed = [3, 17, 18, 90, 150, 199]
    p = np.exp(x[allowed] - x[allowed].max())
    p /= p.sum()
    s = M.Sampler(n, temperature=1.0, seed=7)
    got = [s.sample(x, bits(allowed, n)) for _ in range(draws)]
    assert set(got) <= set(allowed)
    counts = np.array([got.count(t) for t in allowed])
    chi2 = float((((counts - draws * p) ** 2) / (draws * p)).sum())
    assert chi2 < 20.5, chi2  # 5 degrees of freedom, p = 0.001
    # top-k / top-p / min-p cut inside the allowed set, never outside it
    for kw in (dict(top_k=3), dict(top_p=0.5), dict(min_p=0.2), dict(top_k=50, top_p=0.9)):
        s = M.Sampler(n, temperature=1.0, seed=1, **kw)
        assert {s.sample(x, bits(allowed, n)) for _ in range(300)} <= set(allowed)


def test_verify_never_keeps_a_disallowed_draft(rng):
    n = 300
    x = rng.standard_normal(n).astype(np.float32)
    allowed = [5, 6, 7]
    best = int(np.argmax(x))
    draft = best if best not in allowed else 0
    assert M.Sampler(n).verify(x, draft, None, bits(allowed, n)) == allowed[int(np.argmax(x[allowed]))]
    s = M.Sampler(n, temperature=1.0, seed=3)
    assert all(s.verify(x, draft, None, bits(allowed, n)) in allowed for _ in range(200))


def test_sample_rows_takes_each_rows_mask(rng):
    n = 500
    x = rng.standard_normal((3, n)).astype(np.float32)
    masks = np.stack([bits([1, 2], n), np.full((n + 31) // 32, 0xFFFFFFFF, np.uint32), bits([400], n)])
    got = M.sample_rows([M.Sampler(n) for _ in range(3)], x, masks)
    assert got.tolist() == [1 + int(x[0, 2] > x[0, 1]), int(np.argmax(x[1])), 400]


def test_bad_masks_are_errors(rng):
    n = 100
    x = rng.standard_normal(n).astype(np.float32)
    with pytest.raises(minfer.MinferError, match="allows no token"):
        M.Sampler(n).sample(x, np.zeros(4, np.uint32))
    with pytest.raises(minfer.MinferError, match="allows no token"):
        M.Sampler(n, temperature=1.0).sample(x, np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"allow must be \[1, 4\] words"):
        M.Sampler(n).sample(x, np.zeros(3, np.uint32))
    with pytest.raises(TypeError, match="int32 or uint32"):
        M.Sampler(n).sample(x, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"allow must be \[2, 4\] words"):
        M.sample_rows([M.Sampler(n), M.Sampler(n)], np.stack([x, x]), np.zeros((1, 4), np.uint32))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_argmax_where_the_logits_are_keeps_to_the_mask(device):
    """Session.eval_greedy and BatchRunner.step_greedy with a mask (an array, or a callable called while the step
    runs) against the masked argmax of the logits the same steps return; on CUDA the mask goes to the device."""
    from conftest import layout_model, real_model, require_cuda

    if device == "cuda":
        require_cuda()
        path = layout_model("qwen2.5-coder-0.5b-instruct-q4_k_m")  # the real layout, random weights
    else:
        path = real_model("qwen2.5-coder-0.5b")
    model = engine.Model(str(path))
    sess = engine.Session(model, n_ctx=64, threads=2, device=device)
    n = model.config["n_vocab"]
    prompt = np.array([9707, 11, 1879, 374], np.int32)
    logits = sess.eval(prompt, 0)[-1]
    top = np.argsort(-logits)
    allowed = sorted([int(top[5]), int(top[40]), 77])
    want = allowed[int(np.argmax(logits[allowed]))]
    assert want != int(top[0])
    assert sess.eval_greedy(prompt, 0, bits(allowed, n)) == want
    calls = []
    assert sess.eval_greedy(prompt, 0, lambda: calls.append(1) or bits(allowed, n).view(np.int32)) == want
    assert calls == [1]
    assert sess.eval_greedy(prompt, 0) == int(top[0])  # and without one, the plain argmax again
    with pytest.raises(minfer.MinferError, match="allows no token"):
        sess.eval_greedy(prompt, 0, np.zeros((n + 31) // 32, np.uint32))
    runner = engine.BatchRunner(model, n_ctx=64, threads=2, kv_tokens=256, block_size=16, device=device)
    toks = np.array([9707, 11, 1879, 374, 3555, 264, 1273], np.int32)
    args = (toks, np.array([0, 1, 2, 3, 0, 1, 2], np.int32), np.array([4, 3], np.int32),
            np.array([[0, 0, 0, 0], [1, 0, 0, 0]], np.int32))
    rows = runner.step(*args)
    allowed2 = [int(np.argsort(-rows[1])[3]), 500]
    masks = np.stack([bits(allowed, n), bits(allowed2, n)])
    got = runner.step_greedy(*args, allow=masks)
    assert got.tolist() == [allowed[int(np.argmax(rows[0][allowed]))], allowed2[int(np.argmax(rows[1][allowed2]))]]
    assert runner.step_greedy(*args, allow=lambda: masks).tolist() == got.tolist()


# -- compiling constraints -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(json_schema={"type": "foo"}), "json_schema: Invalid type: foo"),
    (dict(json_schema="{not json"), "json_schema: not valid JSON"),
    (dict(json_schema={"type": "array", "uniqueItems": True}), "Unimplemented keys"),
    (dict(json_schema={"$ref": "#/$defs/nope"}), "nope"),
    (dict(regex="[a-"), "(?s)regex: .*unclosed character class"),
    (dict(grammar="start: foo"), "(?s)grammar: .*unknown name"),
    (dict(grammar="root ::= missing"), "(?s)grammar: .*missing"),
    (dict(choices=[]), "choices is empty"),
    (dict(choices=["a", ""]), "non-empty string"),
    (dict(regex="a", choices=["a"]), "give one constraint, not choices and regex"),
])
def test_a_constraint_that_does_not_compile_is_a_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        constrain.pop_constraint(dict(kw))


def test_constraint_types_are_checked():
    with pytest.raises(TypeError, match="json_schema must be"):
        constrain.pop_constraint({"json_schema": 3})
    with pytest.raises(TypeError, match="regex must be a string"):
        constrain.pop_constraint({"regex": 3})
    with pytest.raises(TypeError, match="choices must be a list"):
        constrain.pop_constraint({"choices": "ab"})
    assert constrain.pop_constraint({"json_schema": None, "temperature": 1.0}) is None


def test_numbers_are_bounded_where_the_schema_leaves_them_open():
    s = json.loads(constrain._schema({"type": "object", "properties": {"x": {"type": "number"},
                                                                       "y": {"type": ["number", "null"]},
                                                                       "z": {"type": "number", "multipleOf": 0.5},
                                                                       "k": {"enum": [{"type": "number"}]}}}))
    p = s["properties"]
    assert p["x"]["multipleOf"] == p["y"]["multipleOf"] == constrain.NUMBER_STEP
    assert p["z"]["multipleOf"] == 0.5 and p["k"] == {"enum": [{"type": "number"}]}
    assert p["x"]["maximum"] == -p["x"]["minimum"] == constrain.NUMBER_LIMIT
    i = json.loads(constrain._schema({"type": "integer", "minimum": 3}))
    assert i == {"type": "integer", "minimum": 3, "maximum": constrain.NUMBER_LIMIT}


def test_pydantic_models_are_schemas():
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: int

    c = constrain.pop_constraint({"json_schema": Point})
    assert c.kind == "json_schema"


# -- real models ----------------------------------------------------------------------------------------------
def _template(path):
    with gguf.open(str(path)) as f:
        return f.metadata.get("tokenizer.chat_template")


def _valid(text, schema):
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_every_schema_greedy_and_sampled_in_the_batch_engine(qwen05_path):
    """33 schemas x (greedy, sampled at temperature 1): every output parses and validates, many of them asked of
    prompts the model would answer in prose; plain requests in the same batch give what they give alone."""
    tmpl = _template(qwen05_path)
    prompts = [chat.render(tmpl, [{"role": "user", "content": p}], add_generation_prompt=True) for p, _ in SCHEMAS]
    with Engine(str(qwen05_path), threads=2, max_sequences=16) as eng:
        plain = eng.submit(prompts[1], max_tokens=24, parse_special=True).result()
        handles = []
        for i, (p, (_, schema)) in enumerate(zip(prompts, SCHEMAS)):
            handles.append((schema, eng.submit(p, max_tokens=300, parse_special=True, json_schema=schema)))
            handles.append((schema, eng.submit(p, max_tokens=300, parse_special=True, json_schema=schema,
                                               temperature=1.0, seed=i)))
            if i == 5:
                mixed = eng.submit(prompts[1], max_tokens=24, parse_special=True)
        for schema, h in handles:
            out = h.result()
            assert out.metrics.stop_reason == "stop", out.text
            _valid(out.text, schema)
        assert mixed.result().tokens == plain.tokens


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"])
def test_one_sequence_outputs_validate(model):
    from conftest import real_model

    path = real_model(model)
    picks = [SCHEMAS[i] for i in (0, 1, 6, 10, 20, 23)]
    with LLM(str(path), threads=2) as llm:
        for i, (prompt, schema) in enumerate(picks):
            for kw in (dict(), dict(temperature=1.0, seed=i)):
                out = llm.chat([{"role": "user", "content": prompt}], max_tokens=300, json_schema=schema, **kw)
                assert out.metrics.stop_reason == "stop", out.text
                _valid(out.text, schema)


def test_each_greedy_token_is_the_best_the_grammar_allows(qwen05_path):
    """The constrained greedy tokens against an independent replay: the model's logits for the whole output
    (LLM.logits) and a fresh llguidance matcher's allowed set at each position, token by token."""
    schema = SCHEMAS[6][1]
    with LLM(str(qwen05_path), threads=2) as llm:
        prompt = llm.tokenize("A city as JSON:")
        out = llm.generate(prompt, max_tokens=120, json_schema=schema)
        assert out.metrics.stop_reason == "stop"
        _valid(out.text, schema)
        logits = llm.logits(prompt + out.tokens)
        vocab = constrain.vocabulary(llm.tokenizer, llm.n_vocab)
        m = llg.LLMatcher(vocab, constrain.compile_constraint("json_schema", schema).grammar)
        narrowed = 0
        for i, tok in enumerate(out.tokens):
            row = logits[len(prompt) - 1 + i]
            ok = allowed_ids(m.compute_bitmask(), llm.n_vocab)
            assert tok == ok[int(np.argmax(row[ok]))]
            narrowed += tok != int(np.argmax(row))
            assert m.consume_token(tok)
        assert narrowed > 0  # the constraint changed what the model would have said
        assert m.is_stopped() or m.is_accepting()


def test_regex_choices_and_grammars(qwen05_path):
    import re

    gbnf = 'root ::= "(" expr ")"\nexpr ::= num (("+" | "*") num)*\nnum ::= [1-9] [0-9]?'
    lark = 'start: "yes" | "no" | "maybe"'
    with LLM(str(qwen05_path), threads=2) as llm:
        for kw in (dict(), dict(temperature=1.0, seed=4)):
            d = llm.generate("Today's date:", max_tokens=30, regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", **kw)
            assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", d.text), d.text
            c = llm.generate("The capital of France is", max_tokens=10, choices=["Paris", "Lyon", "Nice"], **kw)
            assert c.text in ("Paris", "Lyon", "Nice") and c.metrics.stop_reason == "stop"
            g = llm.generate("An arithmetic expression:", max_tokens=40, grammar=gbnf, **kw)
            assert re.fullmatch(r"\([1-9][0-9]?([+*][1-9][0-9]?)*\)", g.text), g.text
            y = llm.generate("Is it raining?", max_tokens=10, grammar=lark, **kw)
            assert y.text in ("yes", "no", "maybe")
        # prompt lookup with a constraint: drafts checked against the mask, the same greedy tokens (a prompt whose
        # greedy answer repeats the list, so that lookup has drafts to offer)
        repeat = ">>> a = [1, 2, 3, 1, 2, 3, 1, 2, 3]\n>>> a\n"
        a = llm.generate(repeat, max_tokens=100,
                         json_schema={"type": "array", "items": {"type": "integer"}, "maxItems": 12})
        b = llm.generate(repeat, max_tokens=100, lookup=True,
                         json_schema={"type": "array", "items": {"type": "integer"}, "maxItems": 12})
        assert a.metrics.stop_reason == "stop" and json.loads(a.text) == [1, 2, 3] * 3
        assert a.tokens == b.tokens and b.metrics.accepted_tokens > 0
        with pytest.raises(ValueError, match="json_schema"):
            llm.generate("x", json_schema={"type": "nope"})
        assert llm.generate("The capital of France is", max_tokens=3).metrics.generated_tokens == 3


def test_the_engine_refuses_lookup_with_a_constraint(qwen05_path):
    with Engine(str(qwen05_path), threads=2, max_sequences=2) as eng:
        with pytest.raises(ValueError, match="lookup=True does not take a constraint"):
            eng.submit("x", lookup=True, regex="a+")
        with pytest.raises(ValueError, match="regex"):
            eng.submit("x", regex="(")


def test_the_vocabulary_marks_special_tokens(qwen05_path):
    tok = tokenizer_mod.from_gguf(str(qwen05_path))
    vocab = constrain.vocabulary(tok, 151936)
    assert constrain.vocabulary(tok, 151936) is vocab  # built once
    assert vocab.vocab_size == 151936 and set(vocab.eos_tokens) == set(tok.special.eog)
    assert vocab.is_special_token(151644) and not vocab.is_special_token(9707)  # <|im_start|>, "Hello"
    m = constrain.compile_constraint("json_schema", {"type": "array", "items": {"type": "integer"}}).matcher(vocab)
    eog = sorted(tok.special.eog)

    def ends_allowed():
        mask = m.mask().view(np.uint32)
        return [bool((mask[t // 32] >> np.uint32(t % 32)) & 1) for t in eog]
    assert ends_allowed() == [False] * len(eog)  # nothing yet: the output may not end
    for t in tok.encode("[1, 2", add_special=False):
        m.consume(t)
    assert ends_allowed() == [False] * len(eog) and not m.done
    m.consume(tok.encode("]", add_special=False)[0])
    assert m.accepting and ends_allowed() == [True] * len(eog)  # complete: an end-of-generation token may follow


def test_cli_json_schema(tmp_path, qwen05_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(schema))
    r = subprocess.run([sys.executable, "-m", "minfer.generate", "-m", str(qwen05_path), "--json-schema", str(f),
                        "--json", "-n", "40", "Pick a digit"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _valid(json.loads(r.stdout)["text"], schema)
    r = subprocess.run([sys.executable, "-m", "minfer.generate", "-m", str(qwen05_path), "--regex", "(", "x"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "error: regex:" in r.stderr


def test_sentencepiece_vocabulary():
    """Gemma 3's SentencePiece vocabulary (U+2581 for spaces, byte-fallback pieces) as llguidance sees it: every
    token of a valid JSON text, a character spelled in byte pieces among them, is allowed in turn, and the end
    only once the value is complete."""
    from conftest import real_model

    tok = tokenizer_mod.from_gguf(real_model("gemma3-270m"))
    vocab = constrain.vocabulary(tok, tok.n_vocab)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["name", "n"], "additionalProperties": False}
    text = '{"name": "Ōkami \U00010348 und so", "n": 42}'
    ids = tok.encode(text, add_special=False)
    assert any(tok.types[i] == tokenizer_mod.BYTE for i in ids)  # the rare character in byte pieces
    m = constrain.compile_constraint("json_schema", schema).matcher(vocab)
    eog = sorted(tok.special.eog)
    for t in ids:
        mask = m.mask().view(np.uint32)
        assert (mask[t // 32] >> np.uint32(t % 32)) & 1, repr(tok.decode([t]))
        assert not any((mask[e // 32] >> np.uint32(e % 32)) & 1 for e in eog)
        m.consume(t)
    mask = m.mask().view(np.uint32)
    assert m.accepting and all((mask[e // 32] >> np.uint32(e % 32)) & 1 for e in eog)
