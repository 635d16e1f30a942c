"""minfer: local LLM inference for GGUF models.

    from minfer import LLM
    llm = LLM("qwen2.5-coder-0.5b")
    print(llm.generate("def fib(n):", max_tokens=32).text)

The native core (C++ CPU kernels, a CUDA backend, the Metal backend planned) lives in
`minfer._minfer`; this package is the Python face of it.
"""
from ._minfer import GGUFError, MinferError, ModelError, OutOfMemoryError, cuda_info, metal_info
from . import gguf, quants
from .hub import fetch, pull
from .llm import LLM, Completion, ContextLengthError, Metrics

__version__ = "0.1.0"
__all__ = ["LLM", "Completion", "Metrics", "MinferError", "GGUFError", "ModelError", "OutOfMemoryError", "ContextLengthError", "gguf", "quants",
           "fetch", "pull", "cuda_info", "metal_info"]
