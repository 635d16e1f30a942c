"""The settings table (MINFER_* variables: one declaration, parsed once, strictly) and the kernel-choice
test hook (minfer.engine.force_kernel)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import minfer
from minfer import engine

REPO = Path(__file__).resolve().parent.parent


def test_table_declares_each_setting_once_with_its_meaning():
    table = minfer.settings()
    names = [s["name"] for s in table]
    assert len(names) == len(set(names)) <= 15
    for s in table:
        assert s["name"].startswith("MINFER_") and s["meaning"] and s["allowed"], s
        assert s["type"] in ("bool", "number", "choice", "text", "ops"), s
        assert s["source"] in ("default", "environment", "set") and not s["error"], s


def test_only_the_settings_code_reads_the_environment():
    """Every MINFER_* variable is read through the table: no other source file calls getenv or reads
    os.environ (the tests and benchmarks are not the library)."""
    offenders = []
    for path in list((REPO / "csrc").rglob("*")) + list((REPO / "python" / "minfer").rglob("*.py")):
        if not path.is_file() or path.suffix not in (".cpp", ".cu", ".cuh", ".h", ".mm", ".inc", ".py"):
            continue
        if path == REPO / "csrc" / "common" / "settings.cpp":
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\bgetenv\b|os\.environ|os\.getenv", line):
                offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_variable_the_library_names_is_in_the_table():
    declared = {s["name"] for s in minfer.settings()}
    named = set()
    for path in list((REPO / "csrc").rglob("*")) + list((REPO / "python" / "minfer").rglob("*.py")):
        if path.is_file() and path.suffix in (".cpp", ".cu", ".cuh", ".h", ".mm", ".py"):
            named |= set(re.findall(r"\bMINFER_[A-Z0-9_]+", path.read_text(errors="replace")))
    # compile-time macros and CMake options are not environment settings
    macros = {n for n in named if n.startswith(("MINFER_HAVE_", "MINFER_DOT_", "MINFER_CUDA_TYPES", "MINFER_VNNI",
                                                "MINFER_ROWS_KERNELS"))} | {"MINFER_", "MINFER_CUDA"}
    assert named - macros <= declared, sorted(named - macros - declared)


@pytest.mark.parametrize("name,value,message", [
    ("MINFER_HUGEPAGES", "yes", "MINFER_HUGEPAGES='yes': must be 0 or 1"),
    ("MINFER_GPU_TIMEOUT_S", "-3", "MINFER_GPU_TIMEOUT_S='-3': must be a positive number of seconds"),
    ("MINFER_GPU_TIMEOUT_S", "soon", "MINFER_GPU_TIMEOUT_S='soon': must be a positive number of seconds"),
    ("MINFER_DEVICE", "gpu", "MINFER_DEVICE='gpu': must be one of auto, cpu, cuda, metal"),
    ("MINFER_CPU_OPS", "Rope,Rop", "MINFER_CPU_OPS='Rope,Rop': unknown op 'Rop'"),
    ("MINFER_NO_SUCH", "1", "no setting named MINFER_NO_SUCH"),
])
def test_set_setting_checks_like_the_environment(setting, name, value, message):
    with pytest.raises(minfer.MinferError, match=re.escape(message)):
        setting(name, value)


def test_set_setting_changes_and_restores(setting):
    setting("MINFER_GPU_TIMEOUT_S", "2.5")
    row = next(s for s in minfer.settings() if s["name"] == "MINFER_GPU_TIMEOUT_S")
    assert row["value"] == "2.5" and row["source"] == "set"
    setting("MINFER_GPU_TIMEOUT_S", "")
    row = next(s for s in minfer.settings() if s["name"] == "MINFER_GPU_TIMEOUT_S")
    assert row["value"] == row["default"] == "10" and row["source"] == "default"


def test_invalid_environment_value_is_an_error_where_it_is_used():
    """An invalid value in the environment is listed with its error by minfer.settings() and raised,
    naming the variable, the value and what is allowed, by whatever uses it (here a session's device)."""
    code = ("import minfer, minfer._minfer as M\n"
            "row = next(s for s in minfer.settings() if s['name'] == 'MINFER_DEVICE')\n"
            "print(row['source'], row['error'])\n"
            "M.Session(M.Model(%r))\n")
    from conftest import synthetic_model

    model = str(synthetic_model("llama-tiny-q8_0"))
    env = {**os.environ, "MINFER_DEVICE": "gpu"}
    r = subprocess.run([sys.executable, "-c", code % model], env=env, capture_output=True, text=True, timeout=120)
    msg = "MINFER_DEVICE='gpu': must be one of auto, cpu, cuda, metal"
    assert r.returncode != 0 and r.stdout.startswith("environment " + msg) and msg in r.stderr, (r.stdout, r.stderr)


def test_force_kernel_is_checked_and_reversible(force):
    names = {c["name"] for c in engine.kernel_choices()}
    assert {"cuda.matvec", "cuda.attention", "metal.matmul", "metal.attention"} <= names
    with pytest.raises(minfer.MinferError, match="no kernel choice named 'cuda.nothing'"):
        force("cuda.nothing", "1")
    with pytest.raises(minfer.MinferError, match=r"kernel choice cuda.matvec='many': must be auto or one of warp, "
                                                 r"block"):
        force("cuda.matvec", "many")
    force("cuda.matvec", "warp")
    assert next(c for c in engine.kernel_choices() if c["name"] == "cuda.matvec")["forced"] == "warp"
    force("cuda.matvec", "auto")
    assert next(c for c in engine.kernel_choices() if c["name"] == "cuda.matvec")["forced"] == ""
