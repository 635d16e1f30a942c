"""python -m minfer.pull NAME [NAME ...]: download models into the cache.

Names: the models of minfer.hub (smollm2-135m, qwen2.5-coder-0.5b,
qwen2.5-coder-1.5b).  Prints each model's local path."""
import sys

from .hub import MODELS, FetchError, fetch


def main(argv=None) -> int:
    names = (sys.argv[1:] if argv is None else argv)
    if not names or names[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if names else 2
    for name in names:
        if name not in MODELS:
            print(f"error: unknown model {name!r}; known: {', '.join(sorted(MODELS))}", file=sys.stderr)
            return 2
        try:
            print(fetch(name, quiet=False))
        except FetchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
