"""The Metal backend's Objective-C++ host (csrc/backends/metal/*.mm and metal_backend.h)
type-checked on Linux: clang with GNUstep's Foundation and a stub <Metal/Metal.h>
(tests/metal_stub) that declares Apple's API with Apple's names, so a misspelled
or missing selector is an error (-Werror=objc-method-access), as it would be
on a Mac.  What only a Mac can confirm is listed in metal/README.md."""
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOST = sorted((REPO / "csrc" / "backends" / "metal").glob("*.mm"))  # metal_backend.mm, metal_execute.mm


def clang():
    for name in ("clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15", "clang++-14"):
        if shutil.which(name):
            return name
    pytest.skip("clang++ is not installed (CI installs clang-14: .ci/run)")


def typecheck(source: Path, include_first: Path | None = None):
    if not Path("/usr/include/GNUstep/Foundation/Foundation.h").exists():
        pytest.skip("GNUstep Foundation headers are not installed (Debian: libgnustep-base-dev; .ci/run installs them)")
    gcc_inc = subprocess.run(["gcc", "-print-file-name=include"], capture_output=True, text=True).stdout.strip()
    cmd = [clang(), "-fsyntax-only", "-x", "objective-c++", "-std=c++17", "-fblocks", "-fobjc-runtime=gcc",
           "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror", "-Werror=objc-method-access",
           "-I", str(REPO / "tests" / "metal_stub"), "-I", "/usr/include/GNUstep", "-I", gcc_inc,
           *(["-I", str(include_first)] if include_first else []),
           "-I", str(REPO / "csrc"), "-I", str(REPO / "metal"), str(source)]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.parametrize("source", HOST, ids=[p.name for p in HOST])
def test_metal_host_typechecks(source):
    r = typecheck(source)
    assert r.returncode == 0, r.stderr[-4000:]


def test_a_misspelled_selector_fails_the_typecheck(tmp_path):
    """A selector misspelled in a .mm file, or in the shared header (its copy found first on the include path)."""
    bad = tmp_path / "metal_backend.mm"
    bad.write_text(HOST[0].read_text().replace("setComputePipelineState:p]", "setComputePipelinState:p]"))
    assert "setComputePipelinState" in bad.read_text()
    r = typecheck(bad)
    assert r.returncode != 0 and "setComputePipelinState" in r.stderr, r.stderr[-2000:]
    header = (REPO / "csrc" / "backends" / "metal" / "metal_backend.h").read_text()
    assert "newComputePipelineStateWithFunction:" in header
    (tmp_path / "backends" / "metal").mkdir(parents=True)
    (tmp_path / "backends" / "metal" / "metal_backend.h").write_text(
        header.replace("newComputePipelineStateWithFunction:", "newComputePipelineStatWithFunction:"))
    r = typecheck(HOST[1], include_first=tmp_path)
    assert r.returncode != 0 and "newComputePipelineStatWithFunction" in r.stderr, r.stderr[-2000:]
