"""The CLI and the chat template, end to end on the smallest real model."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import real_model, shared_path
from minfer import chat, engine, gguf, tokenizer


@pytest.mark.parametrize("model,fx", [("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m"),
                                      ("smollm2-135m", "smollm2-135m-instruct-q4_1")])
def test_chat_template_renders_the_fixture_prompt(model, fx):
    f = gguf.open(real_model(model))
    text = chat.render(f.metadata["tokenizer.chat_template"], [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that checks whether a number is prime."}])
    assert text == shared_path("fixtures", "llamacpp", "prompts", "c_chatml.txt").read_text("utf-8")
    ids = np.load(shared_path("fixtures", "llamacpp", "real", f"{fx}__c_chatml.npz"))["prompt_ids"]
    assert tokenizer.from_gguf(f).encode(text, parse_special=True) == ids.tolist()
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


def test_readme_quick_start_runs_verbatim():
    """The README's first command, minus the pip install that CI has just done."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n", readme).group(1)
    cmd = first.split("#")[0].strip()
    assert cmd.startswith("pip install . && python -m minfer.generate")
    real_model("qwen2.5-coder-0.5b")  # the default model: fetched (or skipped with the reason) here
    run = cmd.split("&&", 1)[1].strip().replace("python ", f"{sys.executable} ", 1)
    r = subprocess.run(run, shell=True, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "[minfer]" in r.stderr


def test_pull_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "minfer.pull", "no-such"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown model 'no-such'" in r.stderr
    path = real_model("smollm2-135m")
    r = subprocess.run([sys.executable, "-m", "minfer.pull", "smollm2-135m"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == str(path)


def test_corrupt_cache_is_refetched_never_used(tmp_path, setting):
    from minfer import hub

    setting("MINFER_CACHE", str(tmp_path))
    src = hub.MODELS["smollm2-135m"]
    bad = hub.cache_dir() / src.filename
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\0" * src.size)  # right size, wrong bytes, no checksum marker
    assert hub.cached_path("smollm2-135m") is None
    setting("MINFER_OFFLINE", "1")
    with pytest.raises(hub.FetchError, match="not in the cache"):
        hub.fetch("smollm2-135m")


def test_chat_without_a_prompt_starts_from_stdin():
    """--chat with no prompt takes its first turn from stdin (not the default completion prompt): one JSON
    result a stdin line, and the first one answers that line."""
    import json

    path = real_model("smollm2-135m")
    r = subprocess.run([sys.executable, "-m", "minfer.generate", "-m", str(path), "--chat", "--json", "-n", "2", "-t", "2"],
                       input="Name a colour.\nAnd another?\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(results) == 2, r.stdout
    assert results[1]["metrics"]["prompt_tokens"] > results[0]["metrics"]["prompt_tokens"]


def test_generate_cli_json():
    import json

    path = real_model("smollm2-135m")
    r = subprocess.run([sys.executable, "-m", "minfer.generate", "-m", str(path), "--json", "-n", "5", "-t", "2",
                        "--prompt", "The capital of France is"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tok = tokenizer.from_gguf(path)
    assert out["text"] == tok.decode(out["tokens"]) and out["metrics"]["generated_tokens"] == len(out["tokens"])
    assert out["metrics"]["stop_reason"] in ("length", "stop")


# Gemma 3's template in shape: the BOS first, turns of <start_of_turn>role ... <end_of_turn>.  The tiny gemma's
# vocabulary has no turn tokens (they become text) and its BOS is "<s>".
GEMMA_TURNS = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
               "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
               "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def test_a_chat_starts_with_one_bos(tmp_path):
    """The model adds BOS and the template writes it too ({{ bos_token }}, or its text "<s>"): the prompt gets
    one, and the same ids either way (as llama.cpp, the text after a special token takes the space prefix)."""
    from tiny_models import gemma3_q8_0
    from minfer import LLM, chat

    messages = [{"role": "user", "content": "hi there"}]
    got = []
    for k, bos in enumerate(["{{ bos_token }}", "<s>"]):
        path = tmp_path / f"gemma3-{k}.gguf"
        gemma3_q8_0(str(path), chat_template=bos + GEMMA_TURNS)
        llm = LLM(str(path), backend="cpu", threads=2)
        ids = chat.encode(llm.tokenizer, chat.render(llm._template, messages))
        assert ids[0] == 1 and ids.count(1) == 1, ids[:4]
        assert llm.chat(messages, max_tokens=2).metrics.prompt_tokens == len(ids)
        llm.close()
        got.append(ids)
    assert got[0] == got[1]
