"""minfer: local LLM inference for GGUF models.

The native core (C++, with CUDA and Metal backends where the hardware has them)
lives in `minfer._minfer`; this package is the Python face of it.
"""
from ._minfer import GGUFError, MinferError
from . import gguf, quants
from .hub import fetch

__version__ = "0.1.0"
__all__ = ["MinferError", "GGUFError", "gguf", "quants", "fetch"]
