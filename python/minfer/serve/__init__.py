"""An OpenAI-compatible HTTP server over the batching engine: `python -m minfer.serve --model NAME`.

Needs the serve extra (`pip install "minfer[serve]"`: Starlette and uvicorn).  Endpoints: GET /health,
/metrics, /v1/models; POST /v1/completions, /v1/chat/completions (streaming or not), /tokenize, /detokenize.
"""
from .app import Server, build_app

__all__ = ["Server", "build_app"]
