"""The CLI and the chat template, end to end on the smallest real model."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import real_model, shared_path
from minfer import chat, engine, gguf, tokenizer


def test_chat_template_renders_the_fixture_prompt():
    f = gguf.open(real_model("qwen2.5-coder-0.5b"))
    text = chat.render(f.metadata["tokenizer.chat_template"], [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that checks whether a number is prime."}])
    assert text == shared_path("fixtures", "llamacpp", "prompts", "c_chatml.txt").read_text("utf-8")
    assert chat.render(None, [{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_errors():
    with pytest.raises(chat.TemplateError, match="chat template: no"):
        chat.render("{{ raise_exception('no') }}", [])
    with pytest.raises(chat.TemplateError, match="chat template failed"):
        chat.render("{% for %}", [])
    with pytest.raises(chat.TemplateError):  # the sandbox refuses attribute games
        chat.render("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])


def test_generate_cli_matches_the_python_loop():
    path = real_model("smollm2-135m")
    r = subprocess.run([sys.executable, "-m", "minfer.generate", "--model", str(path), "-n", "12", "-t", "2",
                        "The capital of France is"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    tok = tokenizer.from_gguf(path)
    sess = engine.session(str(path), threads=2)
    ids = list(engine.greedy(sess, tok.encode("The capital of France is"), 12))
    assert r.stdout == tok.decode(ids) + "\n"
    assert r.stdout.startswith(" Paris.")  # llama.cpp's greedy continuation starts so too
    assert "prompt 5 tokens, generated 12 (length)" in r.stderr


def test_generate_cli_errors():
    r = subprocess.run([sys.executable, "-m", "minfer.generate", "--model", "no-such-model"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "neither a file nor a known model" in r.stderr
