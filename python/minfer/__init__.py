"""minfer: local LLM inference for GGUF models.

    from minfer import LLM
    llm = LLM("qwen2.5-coder-0.5b")
    print(llm.generate("def fib(n):", max_tokens=32).text)

The native core (C++ kernels for the CPU, CUDA and Metal backends) lives in `minfer._minfer`;
this package is the Python face of it.  `minfer.settings()` lists the MINFER_* settings with their
current values; `minfer.set_setting(name, value)` changes one for this process.
"""
from ._minfer import (GGUFError, MinferError, ModelError, OutOfMemoryError, cuda_info, metal_info, set_setting,
                      settings)
from . import gguf, quants
from .hub import fetch, pull
from .llm import LLM, Completion, ContextLengthError, Metrics

__version__ = "0.1.0"
__all__ = ["LLM", "Completion", "Metrics", "MinferError", "GGUFError", "ModelError", "OutOfMemoryError", "ContextLengthError", "gguf", "quants",
           "fetch", "pull", "cuda_info", "metal_info", "settings", "set_setting"]
