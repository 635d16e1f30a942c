// CPU backend bindings: the thread pool and the quantized matrix product.
#include <memory>

#include "backends/cpu/attention.h"
#include "backends/cpu/matmul.h"
#include "runtime/bandwidth.h"
#include "common/error.h"
#include "python/bind_engine_util.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace minfer {

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Validates w [rows, row_bytes] against type and x [n_tok, cols]; returns (rows, cols, n_tok).
std::tuple<int64_t, int64_t, int64_t> shapes(const py::array& w, uint32_t type, const F32Array& x) {
    const TypeTraits& t = type_traits(type);
    if (!t.known) throw MinferError(strfmt("matmul: unknown weight type id %u", type));
    if (x.ndim() != 1 && x.ndim() != 2) throw MinferError("matmul: x must be [cols] or [n_tok, cols]");
    int64_t cols = x.shape(x.ndim() - 1), n_tok = x.ndim() == 2 ? x.shape(0) : 1;
    if (cols % t.block_size != 0)
        throw MinferError(strfmt("matmul: %lld columns is not a multiple of the %s block size %d", (long long)cols, t.name, t.block_size));
    Bytes wb = bytes_of(w, "w");
    size_t rs = row_size(type, cols);
    if (rs == 0 || wb.n % rs != 0)
        throw MinferError(strfmt("matmul: %zu weight bytes is not a whole number of %s rows of %lld values (%zu bytes)",
                                 wb.n, t.name, (long long)cols, rs));
    return {int64_t(wb.n / rs), cols, n_tok};
}

}  // namespace

void bind_cpu(py::module_& m) {
    py::class_<ThreadPool, std::shared_ptr<ThreadPool>>(m, "ThreadPool")
        .def(py::init<int>(), py::arg("n_threads"))
        .def_property_readonly("size", &ThreadPool::size);
    m.def("physical_cores", &physical_cores);
    m.def("cpu_attention_kernel", [](const std::string& kv_type, int head_dim) {
        return std::string(cpu_attention_kernel(kv_type_from(kv_type), head_dim, default_isa()));
    }, py::arg("kv_type"), py::arg("head_dim"), "the CPU attention kernel this machine runs for such a cache: tiles or f32");
    m.def("read_bandwidth_gbps", [](size_t bytes, int reps, std::shared_ptr<ThreadPool> pool) {
        if (!pool) pool = std::make_shared<ThreadPool>(physical_cores());
        py::gil_scoped_release nogil;
        return read_bandwidth_gbps(bytes, reps, *pool);
    }, py::arg("bytes") = size_t(512) << 20, py::arg("reps") = 5, py::arg("pool") = nullptr,
       "best streaming-read GB/s over `reps` passes of a `bytes` buffer");

    m.def("matmul", [](const py::array& w, uint32_t type, const F32Array& x, std::shared_ptr<ThreadPool> pool,
                       const py::object& isa, py::object out) {
        auto [rows, cols, n_tok] = shapes(w, type, x);
        const DotKernels& k = dot_kernels(isa_from(isa));
        if (!pool) pool = std::make_shared<ThreadPool>(physical_cores());
        py::array_t<float> y;
        if (out.is_none()) {
            y = py::array_t<float>({py::ssize_t(n_tok), py::ssize_t(rows)});
        } else {
            y = py::cast<py::array_t<float>>(out);  // tests pass a poisoned buffer
            if (y.ptr() != out.ptr() || !(y.flags() & py::array::c_style) || y.size() != n_tok * rows || !y.writeable())
                throw MinferError(strfmt("matmul: out must be a writable contiguous float32 array of %lld x %lld",
                                         (long long)n_tok, (long long)rows));
        }
        const void* wp = w.data();
        const float* xp = x.data();
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release nogil;
            matmul(wp, type, rows, cols, xp, n_tok, yp, *pool, k);
        }
        return y;
    }, py::arg("w"), py::arg("type"), py::arg("x"), py::arg("pool") = nullptr, py::arg("isa") = py::none(),
       py::arg("out") = py::none(),
       "Y[n_tok, rows] = X W^T with w the raw rows of `type` and x float32 [n_tok, cols]");

    m.def("matmul_ref", [](const py::array& w, uint32_t type, const F32Array& x) {
        auto [rows, cols, n_tok] = shapes(w, type, x);
        py::array_t<float> y({py::ssize_t(n_tok), py::ssize_t(rows)});
        const void* wp = w.data();
        const float* xp = x.data();
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release nogil;
            matmul_ref(wp, type, rows, cols, xp, n_tok, yp);
        }
        return y;
    }, py::arg("w"), py::arg("type"), py::arg("x"), "float64 reference of matmul (dequantized operands)");
}

}  // namespace minfer
