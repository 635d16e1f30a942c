"""The engine's design objects: a Graph built in Python and one built for the model, scheduled by a
Scheduler over its Backends, and minfer.engine.greedy written on them -- checked against the float64
reference backend and against the Session."""
from __future__ import annotations

import numpy as np
import pytest

import minfer
from minfer import engine as E
from conftest import synthetic_model


@pytest.fixture(scope="module")
def sched():
    return E.scheduler(str(synthetic_model("qwen2-tiny-q8_0")), threads=2, n_ctx=64, device="cpu")


def ffn_graph(rows: int) -> E.Graph:
    """A layer's FFN block built op by op: x + down(silu(gate(norm(x))) * up(norm(x)))."""
    g = E.Graph()
    x = g.input(rows, 128)
    h = g.add("RmsNorm", [x], rows, 128, dict(weight="blk.0.ffn_norm.weight", eps=1e-6))
    gate = g.add("MatMul", [h], rows, 384, dict(weight="blk.0.ffn_gate.weight", role="gate"))
    up = g.add("MatMul", [h], rows, 384, dict(weight="blk.0.ffn_up.weight", role="up"))
    act = g.add("Silu", [gate], rows, 384)
    prod = g.add("Mul", [act, up], rows, 384)
    down = g.add("MatMul", [prod], rows, 128, dict(weight="blk.0.ffn_down.weight"))
    g.add("Add", [x, down], rows, 128)
    return g


def run(sched, graph, x, **kw):
    plan = sched.schedule(graph, **kw)
    plan.write(0, x)
    sched.run(plan)
    return plan, plan.read(plan.output)


def test_backends_are_devices(sched):
    names = [b.name for b in sched.backends]
    assert names == ["cpu", "reference"], names
    cpu = sched.backends[0]
    assert cpu.supports_fused("FusedFFN") and not sched.backends[1].supports_fused("FusedFFN")


@pytest.mark.parametrize("rows", [1, 5])
def test_graph_built_in_python_over_two_backends(sched, rng, rows):
    """The same hand-built graph scheduled over the CPU and the reference backend alternating every node (a
    split at each, inputs copied across) and on the reference alone: within the CPU kernels' bound (8-bit
    activations), and every node ran where the plan put it."""
    x = rng.standard_normal((rows, 128)).astype(np.float32)
    _, ref = run(sched, ffn_graph(rows), x, assignment="only:reference")
    plan, mixed = run(sched, ffn_graph(rows), x, assignment="alternate:1", fuse=False)
    backends = [n["backend"] for n in plan.nodes[1:]]
    assert set(backends) == {0, 1} and len(plan.splits) >= 6, plan.splits
    assert np.all(np.isfinite(mixed))
    assert np.abs(mixed - ref).max() <= 2e-2 * np.abs(ref).max(), np.abs(mixed - ref).max()
    # by priority (every node on the CPU) the fusion pass takes gate/up + SwiGLU: one FusedFFN node
    plan, fused = run(sched, ffn_graph(rows), x)
    assert [n["op"] for n in plan.nodes].count("FusedFFN") == 1 and len(plan.splits) == 1
    assert np.abs(fused - ref).max() <= 2e-2 * np.abs(ref).max()


def test_graph_errors_name_the_problem(sched):
    g = E.Graph()
    with pytest.raises(ValueError, match="unknown op 'Matmul'"):
        g.add("Matmul", [], 1, 1)
    x = g.input(1, 128)
    with pytest.raises(ValueError, match="earlier node"):
        g.add("Silu", [x + 1], 1, 128)
    with pytest.raises(ValueError, match="no nodes"):
        sched.schedule(E.Graph())


def test_decoder_graph_step_matches_the_session(sched):
    """The model's graph scheduled by hand gives the Session's logits bit for bit (same kernels, same plan)."""
    ids = np.array([5, 900, 77, 3, 12000], np.int32)
    plan = sched.schedule(E.Graph.decoder(sched, len(ids)))
    assert plan.n_tokens == len(ids)
    sched.step(plan, ids, 0)
    logits = plan.read(plan.output)
    sess = E.Session(sched.model, threads=2, n_ctx=64, device="cpu")
    assert np.array_equal(logits, sess.eval(ids, 0))
    with pytest.raises(minfer.MinferError, match="exceed the context"):
        sched.step(plan, ids, 62)


def test_the_cpu_does_not_chain(sched):
    """Whether a session's greedy steps chain on the device is the backend's answer (CUDA's yes; the CPU's
    no), and where they do not, decode_greedy is the host loop: the same tokens, no chained steps."""
    sess = E.Session(sched.model, threads=2, n_ctx=64, device="cpu")
    assert not sess.chains
    first = sess.eval_greedy(np.array([5, 900, 77], np.int32), 0)
    steps = sess.decode_greedy(first, 3, 4).tolist()
    assert sess.chained_steps == 0 and len(steps) == 4


def test_greedy_on_the_scheduler_equals_the_session(sched):
    prompt = [5, 900, 77, 3]
    on_sched = list(E.greedy(sched, prompt, 12, chunk=5))
    sess = E.Session(sched.model, threads=2, n_ctx=64, device="cpu")
    assert on_sched == list(E.greedy(sess, prompt, 12, chunk=5))
    # and each token is the argmax of the logits of the sequence so far
    seq = list(prompt)
    for tok in on_sched[:4]:
        assert tok == int(np.argmax(sess.eval(np.array(seq, np.int32), 0)[-1]))
        seq.append(tok)
