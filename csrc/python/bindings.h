#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "quant/quant.h"

namespace minfer {
void bind_gguf(pybind11::module_& m);
void bind_quant(pybind11::module_& m);
void bind_cpu(pybind11::module_& m);
void bind_engine(pybind11::module_& m);
void bind_sampling(pybind11::module_& m);
void bind_devices(pybind11::module_& m);
void bind_settings(pybind11::module_& m);
void bind_scheduler(pybind11::module_& m);
void bind_batch(pybind11::module_& m);

// Raw bytes of a C-contiguous numpy array (error if it is not contiguous).
struct Bytes {
    const uint8_t* p;
    size_t n;
};
Bytes bytes_of(const pybind11::array& a, const char* what);
// "scalar" | "avx2" | "avx512" | "neon", or None for the default.
Isa isa_from(const pybind11::object& name);
}  // namespace minfer
