#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "graph/plan.h"
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
// Constrained decoding's token masks: None (nullptr), or a C-contiguous int32/uint32 array of `rows` rows of
// ceil(n_vocab / 32) words (a single row may be 1-D), bit t of a row's word t / 32 set where token t may come
// next.  The pointer lives as long as `allow` does.
const uint32_t* allow_mask(const pybind11::object& allow, int rows, int n_vocab);
// A greedy step's allow: None, a mask array, or a callable returning one, called (taking the GIL) once the step
// is launched, so the masks are computed while a GPU runs it.  `hold` keeps the array alive: declare it before
// the step's GIL release, so it is dropped with the GIL held.
Plan::AllowFn allow_fn(const pybind11::object& allow, int rows, int n_vocab, pybind11::object& hold);
// "scalar" | "avx2" | "avx512" | "neon", or None for the default.
Isa isa_from(const pybind11::object& name);
}  // namespace minfer
