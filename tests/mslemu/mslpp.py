"""mslpp: turns Metal Shading Language sources into one C++ file for the emulator.

    python tests/mslemu/mslpp.py OUT.cpp metal/a.metal metal/b.metal ...

The sources are included unchanged but for one spelling ([[threadgroup(i)]]
becomes [[msl_threadgroup(i)]], since `threadgroup` is a macro), and `#line` keeps compiler errors and
sanitizer reports pointing at the .metal lines; the prelude `metal_stdlib`
makes them C++).  For every `kernel void NAME(...)` a launcher
`msl_launch_NAME(const msl::Dispatch*)` is appended that binds each parameter
the way a Metal encoder would: [[buffer(i)]] from the bound buffers (a
`constant T&` argument struct is checked against its buffer's length, every
buffer the kernel declares must be bound), [[threadgroup(i)]] from the
threadgroup memory the dispatch sets, and the built-in positions from the
scheduler's per-thread state.

Rules this enforces for minfer's kernels (they keep the emulator honest):
threadgroup memory only as [[threadgroup(i)]] parameters, and no kernels made
by macros (every kernel is written out, so this parser sees it).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

BUILTINS = {
    "thread_position_in_threadgroup": "t.tid",
    "thread_index_in_threadgroup": "t.tidx",
    "threadgroup_position_in_grid": "t.tgid",
    "thread_position_in_grid": "t.gid",
    "threads_per_threadgroup": "t.ntg",
    "threadgroups_per_grid": "t.ngrid",
    "thread_index_in_simdgroup": "t.lane",
    "simdgroup_index_in_threadgroup": "t.sg",
    "simdgroups_per_threadgroup": "t.nsg",
}
PARAM = re.compile(r"^(?P<type>.*?)(?P<name>\w+)\s*\[\[\s*(?P<attr>\w+)(?:\s*\(\s*(?P<idx>\d+)\s*\))?\s*\]\]$", re.S)


class MslError(Exception):
    pass


def split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def kernels_of(path: Path, src: str) -> list[tuple[str, list[dict]]]:
    code = strip_comments(src)
    found = []
    for m in re.finditer(r"\bkernel\s+void\s+(\w+)\s*\(", code):
        name, i, depth = m.group(1), m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        params = []
        for p in split_params(code[m.end():i - 1]):
            pm = PARAM.match(p)
            if not pm:
                raise MslError(f"{path}: kernel {name}: parameter '{p}' has no [[...]] binding")
            params.append(dict(type=pm["type"].strip(), name=pm["name"], attr=pm["attr"], idx=pm["idx"]))
        found.append((name, params))
    # threadgroup memory may only come in as parameters
    for ln, line in enumerate(code.splitlines(), 1):
        if re.match(r"\s*threadgroup\s+[\w:<>]+\s+\w+\s*\[", line):
            raise MslError(f"{path}:{ln}: threadgroup array declared in a function; take it as a "
                           "[[threadgroup(i)]] parameter")
    if re.search(r"#\s*define[^\n]*\bkernel\b", code):
        raise MslError(f"{path}: a macro defines kernels; write each kernel out")
    return found


def launcher(name: str, params: list[dict]) -> str:
    args, checks = [], []
    for p in params:
        t, a, i = p["type"], p["attr"], p["idx"]
        if a == "buffer":
            checks.append(f'    if (!d->buffers[{i}]) return "kernel {name}: buffer({i}) ({p["name"]}) is not bound";')
            if t.endswith("&"):
                base = t[:-1].strip()
                checks.append(f"    if (d->buffer_bytes[{i}] < sizeof(std::remove_cv_t<{base}>)) "
                              f'return "kernel {name}: buffer({i}) ({p["name"]}) is shorter than its struct";')
                args.append(f"*reinterpret_cast<{base}*>(d->buffers[{i}])")
            else:
                args.append(f"reinterpret_cast<{t}>(d->buffers[{i}])")
        elif a == "threadgroup":
            checks.append(f'    if (!d->tg_bytes[{i}]) return "kernel {name}: threadgroup({i}) ({p["name"]}) has no length";')
            args.append(f"reinterpret_cast<{t}>(t.tg_mem[{i}])")
        elif a in BUILTINS:
            args.append(f"::msl::builtin<{t}>({BUILTINS[a]})")
        elif a == "threads_per_simdgroup":
            args.append(f"{t}(32)")
        else:
            raise MslError(f"kernel {name}: unknown attribute [[{a}]] on {p['name']}")
    body = ",\n            ".join(args)
    return (f'extern "C" const char* msl_launch_{name}(const msl::Dispatch* d) {{\n' + "\n".join(checks) +
            f"\n    return msl::run(*d, [d](const msl::ThreadState& t) {{\n        (void)d;\n"
            f"        {name}(\n            {body});\n    }});\n}}\n")


def translate(out: Path, sources: list[Path]) -> list[str]:
    parts, names = ['#include "metal_stdlib"\n#include <type_traits>\n'], []
    for path in sources:
        src = path.read_text()
        ks = kernels_of(path, src)
        # `threadgroup` is a macro (an address space that vanishes); inside an attribute it must survive
        body = re.sub(r"\[\[\s*threadgroup\s*\(", "[[msl_threadgroup(", src)
        parts.append(f'#line 1 "{path}"\n{body}\n')
        parts.append(f'#line 1 "launchers of {path.name}"\n')
        parts.extend(launcher(n, p) for n, p in ks)
        names += [n for n, _ in ks]
    parts.append('extern "C" const char* msl_kernel_names() { return "' + ",".join(names) + '"; }\n')
    out.write_text("".join(parts))
    return names


if __name__ == "__main__":
    try:
        translate(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
    except MslError as e:
        sys.exit(str(e))
