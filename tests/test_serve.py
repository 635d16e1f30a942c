"""The OpenAI-compatible server (python -m minfer.serve): real servers on 127.0.0.1 with the tiny synthetic
model, talked to with the official `openai` client and, for the error cases, plain HTTP."""
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import synthetic_model

openai = pytest.importorskip("openai", reason="the server tests need the openai client (pip install openai)")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx")
pytest.importorskip("uvicorn", reason='the server needs its extra (pip install "minfer[serve]")')
pytest.importorskip("starlette", reason='the server needs its extra (pip install "minfer[serve]")')

import minfer  # noqa: E402  (the server runs the minfer these tests import: installed, or python/ on the path)

PYTHON_DIR = Path(minfer.__file__).resolve().parents[1]


class Served:
    def __init__(self, proc, port, key=None):
        self.proc, self.port, self.key = proc, port, key
        self.url = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0, timeout=60)

    def metrics(self) -> dict:
        h = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        out = {}
        for line in httpx.get(self.url + "/metrics", headers=h, timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def start(*args, key=None, model=None) -> Served:
    """A server of the tiny synthetic model (or `model`) on a free port, once /health says ok."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "minfer.serve", "--model", model or str(synthetic_model("qwen2-tiny-q8_0")), "--port",
           str(port), "--threads", "2", "--ctx", "256", *args] + (["--api-key", key] if key else [])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    srv = Served(proc, port, key)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(srv.url + "/health", timeout=1).status_code == 200:
                return srv
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not become ready in 60 s")


def stop(srv: Served) -> None:
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(30)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()


@pytest.fixture(scope="module")
def server():
    srv = start("--max-sequences", "32")
    yield srv
    stop(srv)


def solo(srv, prompt, n=12, **kw):
    return srv.client.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0, **kw)


def test_completion_and_chat_streaming_and_not(server):
    c = solo(server, "def fib(n):", 12)
    assert c.object == "text_completion" and c.choices[0].finish_reason == "length"
    n_prompt = len(httpx.post(server.url + "/tokenize", json={"content": "def fib(n):"}).json()["tokens"])
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (n_prompt, 12, n_prompt + 12)
    streamed = server.client.completions.create(model="m", prompt="def fib(n):", max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices

    msgs = [{"role": "user", "content": "Say hi."}]
    r = server.client.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 10
    st = list(server.client.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0,
                                                    stream=True))
    assert st[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in st) == r.choices[0].message.content
    assert st[-1].choices[0].finish_reason == "length"
    assert [m.id for m in server.client.models.list().data] == ["qwen2-tiny-q8_0"]


def test_stop_strings_seeds_and_n(server):
    full = solo(server, "The list:", 16).choices[0].text
    cut = full[len(full) // 2:][:3]
    assert cut
    stopped = solo(server, "The list:", 16, stop=[cut]).choices[0]
    assert stopped.text == full[:full.index(cut)] and stopped.finish_reason == "stop"
    kw = dict(model="m", prompt="Once", max_tokens=12, temperature=1.0, top_p=0.95)
    a = server.client.completions.create(seed=7, **kw).choices[0].text
    assert server.client.completions.create(seed=7, **kw).choices[0].text == a
    assert server.client.completions.create(seed=8, **kw).choices[0].text != a
    many = server.client.completions.create(seed=7, n=3, **kw)
    assert [ch.index for ch in many.choices] == [0, 1, 2] and many.choices[0].text == a
    assert many.usage.completion_tokens == 36


@pytest.mark.parametrize("body,status,param", [
    ("not json", 400, None),
    ({"prompt": "x", "max_tokens": "a"}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": 5}, 400, "temperature"),
    ({"prompt": "x", "bogus": 1}, 400, "bogus"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": 3}, 400, "prompt"),
    ({"prompt": [999999999]}, 400, "prompt"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
])
def test_invalid_requests_are_400_with_openai_errors(server, body, status, param):
    r = httpx.post(server.url + "/v1/completions", content=body if isinstance(body, str) else json.dumps(body))
    assert r.status_code == status
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_prompt_longer_than_the_context(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": list(range(100, 400)), "max_tokens": 4})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "300" in err["message"] and "256" in err["message"] and err["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        server.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a " * 400}])
    assert httpx.get(server.url + "/v1/nothing").status_code == 404


def test_disconnect_cancels_the_sequence(server):
    before = server.metrics()
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 200, "stream": True, "temperature": 0}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # the first token came: leave
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["minfer_requests_running"] == 0 and \
                m['minfer_requests_total{outcome="cancelled"}'] > before['minfer_requests_total{outcome="cancelled"}']:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the sequence kept running after its client left: {m}")
    assert m["minfer_generated_tokens_total"] - before["minfer_generated_tokens_total"] < 200


def streams_at_once(srv, prompts, n):
    """Each prompt's greedy completion streamed, all at once from as many threads."""
    def stream(p):
        return "".join(ch.choices[0].text for ch in srv.client.completions.create(
            model="m", prompt=p, max_tokens=n, temperature=0, stream=True))
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(stream, prompts))


def test_concurrent_streams_each_equal_their_solo_text(server):
    prompts = [f"Item {i}: the" for i in range(32)]
    alone = [solo(server, p, 16).choices[0].text for p in prompts]
    assert streams_at_once(server, prompts, 16) == alone
    m = server.metrics()
    assert m["minfer_kv_blocks_used"] == 0 and m["minfer_requests_running"] == 0
    assert m['minfer_time_to_first_token_seconds_count'] > 0 and m['minfer_inter_token_latency_seconds_count'] > 0


def test_lookup_server_gives_the_same_streams(server):
    """--lookup and --draft-model: every request checks drafts (prompt lookup's, else the draft model's) in its
    rows of the batch step; concurrent greedy streams equal the plain server's, and drafts were kept."""
    prompts = [f"{i} one two three {i} one two three {i} one two" for i in range(8)]
    alone = [solo(server, p, 24).choices[0].text for p in prompts]
    srv = start("--max-sequences", "8", "--lookup", "--draft-model", str(synthetic_model("qwen2-tiny-q4_0")))
    try:
        assert streams_at_once(srv, prompts, 24) == alone
        assert json.loads(srv.client.chat.completions.create(  # a constrained request does not speculate
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=60, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
        ).choices[0].message.content).keys() == {"name", "age"}
        m = srv.metrics()
        assert m["minfer_drafted_tokens_total"] >= m["minfer_accepted_tokens_total"] > 0
    finally:
        stop(srv)


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


def test_structured_output(server):
    """response_format json_schema / json_object and llama.cpp's `grammar` field, on a model of random weights
    (it would emit anything): the output parses and fits; a schema that does not compile is a 400 naming it."""
    jsonschema = pytest.importorskip("jsonschema")
    msgs = [{"role": "user", "content": "Who are you?"}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for kw in (dict(temperature=0), dict(temperature=1.0, seed=3)):
        r = server.client.chat.completions.create(model="m", messages=msgs, max_tokens=80, response_format=rf, **kw)
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
        assert r.choices[0].finish_reason == "stop"
        st = server.client.chat.completions.create(model="m", messages=msgs, max_tokens=80, response_format=rf,
                                                   stream=True, **kw)
        assert "".join(ch.choices[0].delta.content or "" for ch in st) == r.choices[0].message.content
    obj = server.client.completions.create(model="m", prompt="{", max_tokens=120, temperature=0,
                                           extra_body={"response_format": {"type": "json_object"}})
    # random weights ramble inside an open string; the object has begun, and whatever came is a JSON prefix
    text = obj.choices[0].text
    assert text.startswith("{")
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    g = httpx.post(server.url + "/v1/completions", json={"prompt": "?", "max_tokens": 5, "temperature": 0,
                                                         "grammar": 'root ::= "yes" | "no"'}).json()
    assert g["choices"][0]["text"] in ("yes", "no")
    for body, param in ((dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}),
                         "response_format"),
                        (dict(response_format={"type": "xml"}), "response_format"),
                        (dict(grammar="root ::= nothing"), "grammar"),
                        (dict(grammar="a", json_schema={}), "grammar")):
        r = httpx.post(server.url + "/v1/completions", json=dict(prompt="x", **body))
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_api_key():
    srv = start(key="sekrit")
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="m", prompt="x", max_tokens=2)
        assert srv.client.completions.create(model="m", prompt="x", max_tokens=2).usage.completion_tokens == 2
    finally:
        stop(srv)


def test_full_queue_answers_429():
    srv = start("--max-sequences", "1", "--max-queue", "1")
    try:
        def one(_):
            return httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 60}, timeout=60)
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            codes = [r.status_code for r in ex.map(one, range(6))]
        assert 429 in codes and 200 in codes, codes
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 60}, timeout=60)
        assert r.status_code == 200  # and the queue serves again once it has room
        assert r.headers.get("content-type", "").startswith("application/json")
    finally:
        stop(srv)


def test_sigterm_lets_running_requests_finish():
    srv = start()
    out = {}

    def run():
        out["text"] = "".join(ch.choices[0].text for ch in srv.client.completions.create(
            model="m", prompt="x", max_tokens=40, temperature=0, stream=True))
    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while srv.metrics()["minfer_requests_running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert srv.proc.wait(30) == 0
    assert "text" in out and out["text"]


def test_soak_short():
    """benchmarks/soak_serve.py's soak, short: 150 requests of random lengths, a third abandoned mid-stream;
    none lost, the KV blocks all back, the server's memory within 5 % of its memory after a warm-up."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from soak_serve import soak

    srv = start("--max-sequences", "16")
    try:
        r = soak(srv.url, srv.proc.pid, requests=150, warmup=200)
    finally:
        stop(srv)
    assert len(r["outcomes"]) == 150 and "lost" not in r["outcomes"] and "left" in r["outcomes"]
    assert r["running"] == 0 and r["blocks_used"] == 0
    assert r["rss1"] <= r["rss0"] * 1.05, (r["rss0"], r["rss1"])


def test_health_while_loading_and_after_a_failed_load(monkeypatch):
    """/health is 503 (and a request 503 with Retry-After) while the model loads, 200 once it has; a model that
    fails to load makes /health 500 with the reason, and requests 500."""
    from starlette.testclient import TestClient

    from minfer.serve import app as app_mod

    gate, real = threading.Event(), app_mod.Engine

    def slow_engine(*a, **k):
        gate.wait(30)
        return real(*a, **k)
    monkeypatch.setattr(app_mod, "Engine", slow_engine)
    srv = app_mod.Server(str(synthetic_model("qwen2-tiny-q8_0")), threads=2, n_ctx=128)
    with TestClient(app_mod.build_app(srv)) as c:
        assert c.get("/health").status_code == 503
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        gate.set()
        deadline = time.monotonic() + 30
        while c.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()["usage"]["completion_tokens"] == 2

    bad = app_mod.Server("/nonexistent/model.gguf")
    with TestClient(app_mod.build_app(bad)) as c:
        deadline = time.monotonic() + 10
        while c.get("/health").status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.get("/health")
        assert r.status_code == 500 and "nonexistent" in r.json()["error"]
        r = c.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 500 and "failed to load" in r.json()["error"]["message"]


def test_logprobs(server):
    """Completions' logprobs=k and chat's logprobs/top_logprobs: each generated token's log-probability (the
    model's, from the raw logits) and the k likeliest; greedy picks the likeliest; the first token's equals a
    float64 log-softmax of the same model's logits for the prompt, run alone."""
    import numpy as np

    c = server.client.completions.create(model="m", prompt="def fib(n):", max_tokens=6, temperature=0, logprobs=3)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset[0] == 0
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and chosen == pytest.approx(max(top.values()), abs=1e-9) and chosen <= 0
    ids = httpx.post(server.url + "/tokenize", json={"content": "def fib(n):"}).json()["tokens"]
    with minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), threads=2, n_ctx=256) as llm:
        x = llm.logits(ids)[-1].astype(np.float64)
    ref = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    assert lp.token_logprobs[0] == pytest.approx(ref.max(), abs=1e-4)

    st = list(server.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=5, temperature=0.9, seed=3, logprobs=True,
                                                    top_logprobs=2, stream=True))
    entries = [e for ch in st if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert len(entries) == 5 and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
