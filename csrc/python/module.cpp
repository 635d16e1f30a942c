// The extension module minfer._minfer.  Thin: each bind_*.cpp exposes one stage
// of the pipeline; the logic lives in the C++ it binds.
#include "python/bindings.h"

#include <cstring>

#include "common/error.h"

namespace py = pybind11;

// Messages quote names taken from files, which need not be valid UTF-8.
static py::object message(const char* what) {
    PyObject* s = PyUnicode_DecodeUTF8(what, Py_ssize_t(std::strlen(what)), "replace");
    return py::reinterpret_steal<py::object>(s);
}

PYBIND11_MODULE(_minfer, m) {
    m.doc() = "minfer native core";
    // Python-side exception hierarchy: MinferError(RuntimeError) > GGUFError.
    static py::exception<minfer::MinferError> minfer_error(m, "MinferError", PyExc_RuntimeError);
    static py::exception<minfer::GGUFError> gguf_error(m, "GGUFError", minfer_error.ptr());
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const minfer::GGUFError& e) {
            py::set_error(gguf_error, message(e.what()));
        } catch (const minfer::MinferError& e) {
            py::set_error(minfer_error, message(e.what()));
        }
    });
    minfer::bind_gguf(m);
    minfer::bind_quant(m);
    minfer::bind_cpu(m);
}
