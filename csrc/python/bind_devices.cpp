// The GPU backends from Python: whether CUDA and Metal are there (and why
// not), and the CUDA kernel entry points the tests and benchmarks call directly.
#include <cstring>
#include <optional>

#include "backends/cuda/cuda_api.h"
#include "backends/metal/metal_api.h"
#include "common/error.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace minfer {

void bind_devices(py::module_& m) {
    m.def("metal_info", [] {
        MetalDeviceInfo i = metal_device_info();
        py::dict d;
        d["built"] = i.built;
        d["available"] = i.available;
        d["reason"] = i.reason;
        d["name"] = i.name;
        return d;
    }, "whether this build has the Metal backend and a usable device (and if not, why)");

    m.def("cuda_info", [] {
        CudaDeviceInfo i = cuda_device_info();
        py::dict d;
        d["built"] = i.built;
        d["available"] = i.available;
        d["reason"] = i.reason;
        d["name"] = i.name;
        d["compute_capability"] = py::make_tuple(i.cc_major, i.cc_minor);
        d["sm_count"] = i.sm_count;
        d["total_bytes"] = i.total_bytes;
        d["free_bytes"] = i.free_bytes;
        return d;
    }, "whether this build has the CUDA backend and a usable device (and if not, why)");

    m.def("cuda_matmul", [](uint32_t type, py::array w, py::array_t<float, py::array::c_style | py::array::forcecast> x,
                            int64_t n_out, int iters, const std::string& path) {
        if (x.ndim() != 2) throw py::value_error("x must be 2-D [rows, K]");
        Bytes wb = bytes_of(w, "w");
        const int rows = int(x.shape(0));
        const int64_t K = x.shape(1);
        double secs = 0.0;
        std::vector<float> y;
        {
            py::gil_scoped_release nogil;
            y = cuda_matmul(type, wb.p, wb.n, n_out, K, x.data(), rows, iters, &secs, path);
        }
        py::array_t<float> out({py::ssize_t(rows), py::ssize_t(n_out)});
        std::memcpy(out.mutable_data(), y.data(), y.size() * 4);
        return py::make_tuple(out, secs);
    }, py::arg("type"), py::arg("w"), py::arg("x"), py::arg("n_out"), py::arg("iters") = 0, py::arg("path") = "auto",
       "(y, seconds per call): y = x W^T on the GPU, W raw GGUF rows of `type`; timed over `iters` calls when > 0; "
       "path: 'auto' (what the backend runs), 'f32' or 'q8' (decode's matvec on f32 or 8-bit activations), 'gemm'");

    m.def("cuda_copy_bandwidth", [](size_t bytes, int iters) {
        py::gil_scoped_release nogil;
        return cuda_copy_bandwidth(bytes, iters);
    }, py::arg("bytes") = size_t(1) << 31, py::arg("iters") = 20, "device-to-device copy rate, bytes read + written per s");

    m.def("cuda_argmax", [](py::array_t<float, py::array::c_style | py::array::forcecast> x, int reps,
                            std::optional<py::array_t<uint32_t, py::array::c_style | py::array::forcecast>> allow) {
        if (x.ndim() != 1 && x.ndim() != 2) throw py::value_error("x must be [n] or [rows, n]");
        const int rows = x.ndim() == 2 ? int(x.shape(0)) : 1, n = int(x.shape(x.ndim() - 1));
        if (allow && (allow->ndim() != 2 || allow->shape(0) != rows || allow->shape(1) != (n + 31) / 32))
            throw py::value_error("allow must be [rows, (n + 31) / 32] uint32 bit masks");
        bool nan = false;
        std::vector<int> won;
        const uint32_t* a = allow ? allow->data() : nullptr;
        {
            py::gil_scoped_release nogil;
            won = cuda_argmax(x.data(), n, rows, reps, a, &nan);
        }
        return py::make_tuple(won, nan);
    }, py::arg("x"), py::arg("reps") = 1, py::arg("allow") = py::none(),
       "(winners, nan): the device argmax of x (greedy decoding's: the first index on ties; [rows, n]: each row's, "
       "a batch step's kernels) among the indices `allow` ([rows, (n + 31) / 32] bit masks) lets win, run `reps` "
       "times back to back, each run's winners in turn, and whether a NaN was flagged");

    m.def("cuda_top_k", [](py::array_t<float, py::array::c_style | py::array::forcecast> x, int k, int iters) {
        if (x.ndim() != 2) throw py::value_error("x must be [rows, n]");
        const int rows = int(x.shape(0)), n = int(x.shape(1));
        py::array_t<float> vals({py::ssize_t(rows), py::ssize_t(std::max(k, 0))});
        py::array_t<int32_t> ids({py::ssize_t(rows), py::ssize_t(std::max(k, 0))});
        bool nan = false;
        double sec = 0.0;
        float* v = vals.mutable_data();
        int32_t* t = ids.mutable_data();
        {
            py::gil_scoped_release nogil;
            cuda_top_k(x.data(), n, rows, k, v, t, &nan, iters, &sec);
        }
        return py::make_tuple(vals, ids, nan, sec);
    }, py::arg("x"), py::arg("k"), py::arg("iters") = 0,
       "(values, ids, nan, seconds per call): each row's k best by value descending, then id, on the GPU (a "
       "sampled batch step's read-back); timed over `iters` calls when > 0");

    m.def("cuda_launch_counts", [] { return cuda_launch_counts(); },
          "{kernel name: launches} this process has made on the GPU (graph replays launch nothing here)");
}

}  // namespace minfer
