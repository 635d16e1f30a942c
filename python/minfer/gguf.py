"""Reading GGUF files: `minfer.gguf.open(path)`.

    >>> f = minfer.gguf.open("model.gguf")
    >>> f.metadata["general.architecture"]
    'qwen2'
    >>> t = f.tensors["blk.0.attn_q.weight"]
    >>> t.type_name, t.shape, t.data.dtype   # data: zero-copy, read-only numpy view
    ('Q4_K', (1536, 1536), dtype('uint8'))

Validation happens in C++ before anything is used; a malformed file raises
`minfer.GGUFError` naming the file, the field and the numbers.  Split models
(`name-00001-of-00003.gguf`) open as one file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import _minfer


@dataclass(frozen=True)
class Tensor:
    name: str
    type: int            # ggml type id
    type_name: str
    shape: tuple         # numpy order: the last axis is contiguous (GGUF dims reversed)
    offset: int          # within its split file's data section
    nbytes: int
    file: int            # split index
    _owner: "GGUFFile"

    @property
    def data(self) -> np.ndarray:
        """Zero-copy read-only view: float arrays typed, block types uint8 [..., row_bytes]."""
        return self._owner._native.tensor_data(self.name)


class GGUFFile:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._native = _minfer.GGUFFile(self.path)

    @property
    def version(self) -> int:
        return self._native.version

    @property
    def alignment(self) -> int:
        return self._native.alignment

    @property
    def paths(self) -> list[str]:
        return self._native.paths

    @cached_property
    def metadata(self) -> dict:
        return self._native.metadata()

    @cached_property
    def metadata_types(self) -> dict:
        return self._native.metadata_types()

    @cached_property
    def tensors(self) -> dict[str, Tensor]:
        return {
            t.name: Tensor(t.name, t.type, t.type_name, t.shape, t.offset, t.nbytes, t.file, self)
            for t in self._native.tensor_infos()
        }

    def close(self) -> None:
        """Drop this object's reference to the mapping (views already handed out keep it alive)."""
        self._native = None
        self.__dict__.pop("tensors", None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<GGUFFile {self.path!r} v{self.version} {len(self.tensors)} tensors>"


def open(path: str | os.PathLike) -> GGUFFile:  # noqa: A001 - mirrors builtins.open on purpose
    return GGUFFile(path)
