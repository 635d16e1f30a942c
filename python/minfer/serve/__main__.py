"""python -m minfer.serve --model NAME_OR_PATH [--host 127.0.0.1] [--port 8000] [--api-key KEY] ..."""
from __future__ import annotations

import argparse
import sys

from ..speculative import MAX_DRAFT


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minfer.serve", description="An OpenAI-compatible server.")
    ap.add_argument("--model", "-m", default=None, help="a GGUF path or a name from minfer.hub (default: the "
                                                           "default model)")
    ap.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    ap.add_argument("--max-sequences", type=int, default=16, help="sequences in one batch step")
    ap.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond which new ones get 429")
    ap.add_argument("--ctx", type=int, default=None, help="context length of a sequence (default: the model's "
                                                         "trained context, or what fits in half the free memory)")
    ap.add_argument("--kv-tokens", type=int, default=None, help="the KV pool's size in tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "metal"])
    ap.add_argument("--lookup", action="store_true",
                    help="speculative decoding with prompt lookup for every request without logprobs (same output)")
    ap.add_argument("--draft-model", default=None,
                    help="a small model with the same vocabulary drafting for every request (same output)")
    ap.add_argument("--draft-max", type=int, default=MAX_DRAFT, help="tokens the draft model proposes per step at most")
    ap.add_argument("--model-id", default=None, help="the name /v1/models reports (default: the file's)")
    ap.add_argument("--drain", type=float, default=30.0,
                    help="seconds running requests get to finish after SIGTERM before they are cancelled")
    a = ap.parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print('minfer.serve needs its extra: pip install "minfer[serve]"', file=sys.stderr)
        return 2
    from .. import hub
    from .app import Server, build_app

    _fixed_mmap_threshold()
    _Server = _server_class()
    server = Server(a.model or hub.DEFAULT_MODEL, n_ctx=a.ctx, threads=a.threads, backend=a.backend,
                    max_sequences=a.max_sequences, max_queue=a.max_queue, api_key=a.api_key,
                    kv_tokens=a.kv_tokens, model_id=a.model_id, lookup=a.lookup, draft_model=a.draft_model,
                    draft_max=a.draft_max)
    print(f"minfer: serving {server.model_id} at http://{a.host}:{a.port}/v1 (ready when /health says ok)",
          flush=True)
    config = uvicorn.Config(build_app(server), host=a.host, port=a.port, log_level="warning",
                            timeout_graceful_shutdown=a.drain)
    _Server(config).run()
    return 0


def _fixed_mmap_threshold() -> None:
    """glibc raises its mmap threshold each time a large block is freed, after which the steps' logits (0.6 MB a
    sequence) come from the heap and a long-running server's memory drifts by tens of MB; a fixed threshold
    keeps large blocks mapped and returned when freed.  Nothing elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _server_class():
    import contextlib
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a SIGTERM or SIGINT it drained for ends the process with 0 (uvicorn
        raises the signal again once it has shut down)."""

        @contextlib.contextmanager
        def capture_signals(self):
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
    return Server


if __name__ == "__main__":
    sys.exit(main())
