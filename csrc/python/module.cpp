// The extension module minfer._minfer.  Thin: each bind_*.cpp exposes one stage
// of the pipeline; the logic lives in the C++ it binds.
#include "python/bindings.h"

#include "common/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_minfer, m) {
    m.doc() = "minfer native core";
    // Python-side exception hierarchy: MinferError(RuntimeError) > GGUFError.
    // Messages are valid UTF-8 by construction (MinferError's constructor).
    auto& minfer_error = py::register_exception<minfer::MinferError>(m, "MinferError", PyExc_RuntimeError);
    py::register_exception<minfer::GGUFError>(m, "GGUFError", minfer_error.ptr());
    py::register_exception<minfer::ModelError>(m, "ModelError", minfer_error.ptr());
    // Both a MinferError and a MemoryError, so either `except` catches it.
    py::register_exception<minfer::OutOfMemoryError>(m, "OutOfMemoryError",
                                                     py::make_tuple(minfer_error, py::handle(PyExc_MemoryError)));
    // What this extension was built as, for bug reports and for tests that must
    // know they run the sanitized build.
    m.def("build_info", [] {
        py::dict d;
#if defined(__clang__)
        d["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
        d["compiler"] = "gcc " __VERSION__;
#endif
#if defined(__SANITIZE_ADDRESS__)
        d["sanitized"] = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
        d["sanitized"] = true;
#else
        d["sanitized"] = false;
#endif
#else
        d["sanitized"] = false;
#endif
#ifdef NDEBUG
        d["assertions"] = false;
#else
        d["assertions"] = true;
#endif
        return d;
    });
    m.attr("pybind11_version") = PYBIND11_VERSION_MAJOR * 10000 + PYBIND11_VERSION_MINOR * 100 + PYBIND11_VERSION_PATCH;
    minfer::bind_gguf(m);
    minfer::bind_quant(m);
    minfer::bind_cpu(m);
    minfer::bind_engine(m);
    minfer::bind_scheduler(m);
    minfer::bind_batch(m);
    minfer::bind_sampling(m);
    minfer::bind_devices(m);
    minfer::bind_settings(m);
}
