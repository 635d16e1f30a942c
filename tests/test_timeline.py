"""benchmarks/profile_cuda.py --timeline: how a CUPTI kernel record CSV becomes a decode step's account
(kernel names without c++filt; each kernel's share is its end minus the previous end, so the shares sum to the
step's span whatever the overlap)."""
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import profile_cuda  # noqa: E402

def mangled(unit: str, name: str, rest: str) -> str:
    """nvcc's form of a kernel in an anonymous namespace: minfer::cuda::(anonymous)::name + `rest`."""
    ns = f"_GLOBAL__N__71ffcce1_12_{unit}_0ebf45e2"
    return f"_ZN6minfer4cuda{len(ns)}{ns}{len(name)}{name}{rest}"


PIPE = mangled("matvec_q8_cu", "matvec_q4k_pipe_kernel", "ILi1EEEvNS0_10MatvecArgsENS1_2XQE")
NORM = mangled("norm_rope_cu", "add_rmsnorm_f4_kernel", "EPKflS3_lPfliS3_fNS0_5Q8ActE")
GATHER = mangled("elementwise_cu", "get_rows_kernel", "ILj12EEEvPKhllS4_PKiPflPj")


def test_kernel_names():
    assert profile_cuda.short_name(PIPE) == "matvec_q4k_pipe_kernel<1>"
    assert profile_cuda.short_name(NORM) == "add_rmsnorm_f4_kernel"
    assert profile_cuda.short_name(GATHER) == "get_rows_kernel"  # an unsigned template argument is not shown
    assert profile_cuda.short_name("plain_c_name") == "plain_c_name"


def test_step_account(tmp_path):
    # eight steps 10 us apart: the gather 0-1 us, a matvec 0.8-5 us (starts before the gather ends), a norm 4.5-7 us
    rows = ["start,end,graph,corr,grid,block,name"]
    for i in range(8):
        t = 1_000_000 + 10_000 * i
        for a, b, grid, name in ((0, 1000, 4, GATHER), (800, 5000, 448, PIPE), (4500, 7000, 4, NORM)):
            rows.append(f"{t + a},{t + b},1,{i},{grid},256,{name}")
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    out = profile_cuda.summarize_timeline(str(path), skip=4)
    lines = out.splitlines()
    # steps 4..6 are whole (a step ends where the next gather starts): 3 steps of 3 kernels
    assert lines[0] == "3 decode steps: kernels 3 a step, span 7.0 us (median), between steps 3.0 us (median)"
    table = {ln.split()[0]: ln.split()[1:] for ln in lines[2:5]}
    # grid, count a step, share, duration, share a launch
    assert table["matvec_q4k_pipe_kernel<1>"] == ["448", "1", "4.0", "4.2", "4.00"]
    assert table["add_rmsnorm_f4_kernel"] == ["4", "1", "2.0", "2.5", "2.00"]
    assert table["get_rows_kernel"] == ["4", "1", "1.0", "1.0", "1.00"]
    assert "one layer in time order" in out
