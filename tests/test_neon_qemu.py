"""The NEON kernels, on a machine without ARM: the core library and
tests/native/dot_check.cpp are cross-compiled for AArch64 (+dotprod) and run
under qemu-aarch64, checking every NEON dot product against the scalar
reference (K-quants bit for bit) and the NEON attention tiles against float64.
.ci/run installs the cross compiler and qemu from Debian; elsewhere the test
says what is missing."""
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORE = ["common/error.cpp", "common/settings.cpp", "gguf/mapped_file.cpp", "gguf/gguf.cpp", "quant/types.cpp", "quant/dequantize.cpp",
        "quant/quantize.cpp", "quant/swiglu.cpp", "quant/dot_ref.cpp", "quant/dot_neon.cpp", "quant/dispatch.cpp",
        "runtime/thread_pool.cpp", "backends/cpu/matmul.cpp", "backends/cpu/ops.cpp", "backends/cpu/attention.cpp",
        "backends/cpu/attention_tiles_neon.cpp", "backends/kernel_choice.cpp", "backends/kv_format.cpp"]


def test_neon_kernels_under_qemu(tmp_path):
    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not cxx or not qemu:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user)")
    exe = tmp_path / "dot_check"
    cmd = [cxx, "-std=c++17", "-O2", "-march=armv8.2-a+dotprod", "-ffp-contract=off", "-DMINFER_HAVE_NEON",
           f"-I{REPO / 'csrc'}", "-static", "-pthread", "-o", str(exe), str(REPO / "tests/native/dot_check.cpp")]
    cmd += [str(REPO / "csrc" / f) for f in CORE]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([qemu, str(exe), "neon"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 16 and all(" 0 bad" in ln for ln in lines), run.stdout
    assert "(kernel tiles)" in lines[-1], run.stdout
