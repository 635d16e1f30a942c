import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def pytest_addoption(parser):
    parser.addoption("--threads", type=int, default=0, help="threads for bench_matmul.py (default: physical cores)")

