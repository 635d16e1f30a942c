"""The native code under AddressSanitizer + UndefinedBehaviorSanitizer (issue 8).

Builds the extension with MINFER_SANITIZE=ON (build/asan-test, incremental) and
runs a chosen part of the suite against it in a child process: the GGUF reader
on malformed files, every quantized kernel and matmul tile at the tested shapes,
the graph engine on the synthetic llama.cpp fixtures and on split backends,
sessions, the sampler, the reliability tests and the batch step and engine.  Any ASan or UBSan report
aborts the child, so it fails here.  Takes 5-7 minutes on two cores; the whole
suite under sanitizers is the documented command in tests/RELIABILITY.md."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBSET = ["tests/test_gguf_malformed.py", "tests/test_gguf.py", "tests/test_dequant.py", "tests/test_quantize.py",
          "tests/test_dot.py", "tests/test_matmul.py", "tests/test_ops.py", "tests/test_cpu_attention.py",
          "tests/test_session.py",
          "tests/test_llamacpp_synthetic.py", "tests/test_splits.py", "tests/test_sampler.py",
          "tests/test_reliability.py", "tests/test_batch.py", "tests/test_batch_engine.py"]


def _tool(name):
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} is not installed (pip install '.[test]' brings cmake and ninja)")
    return path


def test_suite_subset_under_asan_and_ubsan(tmp_path):
    if sys.platform != "linux":
        pytest.skip("the sanitizer run is set up for Linux with GCC's libasan")
    cmake, gxx = _tool("cmake"), _tool("g++")
    _tool("ninja")
    pybind11 = pytest.importorskip("pybind11", reason="pybind11 is needed to build the sanitized extension")
    build = ROOT / "build" / "asan-test"
    subprocess.run([cmake, "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DMINFER_SANITIZE=ON",
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DCMAKE_CXX_COMPILER={gxx}", "-DMINFER_CUDA=OFF",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"], check=True, capture_output=True)
    subprocess.run([cmake, "--build", str(build), "--target", "_minfer"], check=True, capture_output=True)
    # the package with the sanitized extension, first on the path (the installed one is not editable)
    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "python" / "minfer", pkg / "minfer", ignore=shutil.ignore_patterns("_minfer*", "__pycache__"))
    (so,) = build.glob("_minfer*.so")
    shutil.copy(so, pkg / "minfer" / so.name)
    libs = [subprocess.run([gxx, f"-print-file-name={lib}"], capture_output=True, text=True, check=True).stdout.strip()
            for lib in ("libasan.so", "libubsan.so")]
    env = dict(os.environ, PYTHONPATH=str(pkg), LD_PRELOAD=":".join(libs),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *SUBSET],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    info = subprocess.run([sys.executable, "-c", "import minfer._minfer as m; print(m.build_info()['sanitized'])"],
                          env=env, capture_output=True, text=True)
    assert info.stdout.strip() == "True", ("not the sanitized build", info.stdout, info.stderr[-2000:])
    assert "ERROR: AddressSanitizer" not in tail and "runtime error:" not in tail
    print(tail.splitlines()[-1])
