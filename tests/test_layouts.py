"""benchmarks/layout_q8_0.py: the Q8_0 version of a real model's layout (issue 6's
Q8_0 benchmarks) has the header's tensors, shapes and metadata, every matrix in
Q8_0, and runs."""
import sys

import numpy as np

import minfer
from conftest import REPO, shared_path

sys.path.insert(0, str(REPO / "benchmarks"))
import layout_q8_0  # noqa: E402


def test_q8_0_layout_keeps_the_model(tmp_path):
    header = shared_path("fixtures", "layouts", "qwen2.5-coder-0.5b-instruct-q4_k_m.header.gguf")
    out = tmp_path / "q8.gguf"
    layout_q8_0.main([str(header), str(out)])
    _, _, _, _, tensors = layout_q8_0.read_header(str(header))
    f = minfer.gguf.open(out)  # minfer's own reader validates the whole file
    assert len(f.tensors) == len(tensors) == 291
    for name, dims, ttype in tensors:
        t = f.tensors[name.decode()]
        assert tuple(reversed(t.shape)) == tuple(dims), name
        assert t.type_name == ("F32" if ttype == 0 else "Q8_0")
    assert f.metadata["general.architecture"] == "qwen2"
    s = minfer._minfer.Session(minfer._minfer.Model(str(out)), threads=2, n_ctx=32)
    logits = s.eval(np.arange(4, dtype=np.int32), 0)
    assert np.isfinite(logits).all() and logits.std() > 0
