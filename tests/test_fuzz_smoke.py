"""A short libFuzzer run of the GGUF reader and model loader under ASan/UBSan
(tests/fuzz/run.sh) from the committed seed corpus: any crash, hang or
sanitizer report fails.  The long runs and their figures are in
tests/RELIABILITY.md.  .ci/run installs clang-14 for it."""
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_fuzz_smoke(tmp_path):
    if not shutil.which("clang++-14"):
        pytest.skip("needs clang++-14 with libFuzzer (Debian: clang-14 libclang-rt-14-dev)")
    r = subprocess.run(["bash", str(REPO / "tests/fuzz/run.sh"), "15", str(tmp_path)], capture_output=True,
                       text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    runs = [ln for ln in out.splitlines() if ln.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 1000, out[-2000:]
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("timeout-*"))
