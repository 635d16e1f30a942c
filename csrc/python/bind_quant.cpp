// Quantization layer bindings: type facts, (de)quantizers and single dot
// products per ISA, for tests and kernel benchmarks.
#include "common/error.h"
#include "python/bindings.h"
#include "quant/quant.h"

namespace py = pybind11;

namespace minfer {

Bytes bytes_of(const py::array& a, const char* what) {
    if (!(a.flags() & py::array::c_style))
        throw MinferError(strfmt("%s must be a C-contiguous array", what));
    return {(const uint8_t*)a.data(), size_t(a.nbytes())};
}

Isa isa_from(const py::object& name) {
    if (name.is_none()) return default_isa();
    std::string s = py::str(name);
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon})
        if (s == isa_name(isa)) return isa;
    throw py::value_error("unknown ISA '" + s + "' (scalar, avx2, avx512, neon)");
}

namespace {

int64_t values_in(uint32_t type, size_t nbytes, const char* what) {
    const TypeTraits& t = type_traits(type);
    if (!t.known) throw MinferError(strfmt("unknown tensor type id %u", type));
    if (nbytes % size_t(t.type_size) != 0)
        throw MinferError(strfmt("%s: %zu bytes is not a whole number of %s blocks (%d bytes each)", what, nbytes,
                                 t.name, t.type_size));
    return int64_t(nbytes / size_t(t.type_size)) * t.block_size;
}

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

}  // namespace

// The rows/tile kernels' scale side array for n_tok activation rows `rb` bytes
// apart (what the GEMM builds once per matrix); *n_sc floats per row.
static std::vector<float> act_scale_rows(uint32_t at, const uint8_t* a, size_t rb, int64_t n, int n_tok,
                                         int64_t* n_sc) {
    *n_sc = act_scale_count(at, n);
    std::vector<float> sc(size_t(*n_sc * n_tok) + 1);
    for (int t = 0; t < n_tok; t++) act_scales(at, a + size_t(t) * rb, n, sc.data() + t * *n_sc);
    return sc;
}

void bind_quant(py::module_& m) {
    m.def("type_info", [](uint32_t type) {
        const TypeTraits& t = type_traits(type);
        return py::make_tuple(t.name, t.block_size, t.type_size, t.known);
    }, py::arg("type"), "(name, block_size, type_size, known) of a ggml type id");
    m.def("vec_dot_type", &vec_dot_type, py::arg("type"), "activation type consumed by a weight type's dot product");

    m.def("dequantize", [](const py::array& data, uint32_t type) {
        Bytes b = bytes_of(data, "data");
        int64_t n = values_in(type, b.n, "dequantize");
        py::array_t<float> out(n);
        {
            py::gil_scoped_release nogil;
            dequantize_row(type, b.p, out.mutable_data(), n);
        }
        return out;
    }, py::arg("data"), py::arg("type"), "values of a run of blocks of `type` as a flat float32 array");

    m.def("quantize", [](F32Array x, uint32_t type) {
        int64_t n = int64_t(x.size());
        py::array_t<uint8_t> out(py::ssize_t(row_size(type, n)));
        quantize_row_ref(type, x.data(), out.mutable_data(), n);
        return out;
    }, py::arg("x"), py::arg("type"), "reference quantizer (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/F16/F32): flat bytes");

    m.def("quantize_act", [](F32Array x, uint32_t type, const py::object& isa) {
        int64_t n = int64_t(x.size());
        // the scalar reference unless an ISA is named (the GEMM uses its ISA's quantizer: the same bytes)
        const act_quantize_fn q = isa.is_none() ? quantize_row_act : dot_kernels(isa_from(isa)).quantize;
        py::array_t<uint8_t> out(py::ssize_t(row_size(type, n)));
        q(type, x.data(), out.mutable_data(), n);
        return out;
    }, py::arg("x"), py::arg("type"), py::arg("isa") = py::none(), "activation quantizer (Q8_0, Q8_1, Q8_K, F32): flat bytes");

    m.def("swiglu", [](F32Array g, F32Array u, const py::object& isa) {
        if (g.size() != u.size()) throw MinferError(strfmt("swiglu: g has %zd values, u %zd", g.size(), u.size()));
        py::array_t<float> out(g.size());
        dot_kernels(isa_from(isa)).swiglu(g.data(), u.data(), out.mutable_data(), int64_t(g.size()));
        return out;
    }, py::arg("g"), py::arg("u"), py::arg("isa") = py::none(), "the FFN gate silu(g) * u with one ISA's kernel");

    m.def("geglu", [](F32Array g, F32Array u, const py::object& isa) {
        if (g.size() != u.size()) throw MinferError(strfmt("geglu: g has %zd values, u %zd", g.size(), u.size()));
        py::array_t<float> out(g.size());
        dot_kernels(isa_from(isa)).geglu(g.data(), u.data(), out.mutable_data(), int64_t(g.size()));
        return out;
    }, py::arg("g"), py::arg("u"), py::arg("isa") = py::none(), "gemma's FFN gate gelu(g) * u (tanh form), one ISA's kernel");

    m.def("vec_dot", [](uint32_t type, const py::array& w, const py::array& a, const py::object& isa) {
        Bytes wb = bytes_of(w, "w"), ab = bytes_of(a, "a");
        int64_t n = values_in(type, wb.n, "vec_dot weights");
        int64_t na = values_in(vec_dot_type(type), ab.n, "vec_dot activations");
        if (n != na) throw MinferError(strfmt("vec_dot: weights hold %lld values, activations %lld", (long long)n, (long long)na));
        const DotKernels& k = dot_kernels(isa_from(isa));
        if (!k.dot[type]) throw MinferError(strfmt("vec_dot: no %s kernel for %s", isa_name(k.isa), type_traits(type).name));
        return k.dot[type](n, wb.p, ab.p);
    }, py::arg("type"), py::arg("w"), py::arg("a"), py::arg("isa") = py::none());

    m.def("vec_dot_rows", [](uint32_t type, const py::array& w, const py::array& a, const py::object& isa) {
        // a: 1, 2, 4 or 8 activation rows, contiguous; the GEMM's unit kernel with its scale side array
        Bytes wb = bytes_of(w, "w"), ab = bytes_of(a, "a");
        int64_t n = values_in(type, wb.n, "vec_dot_rows weights");
        int64_t na = values_in(vec_dot_type(type), ab.n, "vec_dot_rows activations");
        if (na != n && na != 2 * n && na != 4 * n && na != 8 * n)
            throw MinferError(strfmt("vec_dot_rows: weights hold %lld values, activations %lld (want 1x, 2x, 4x or 8x)", (long long)n, (long long)na));
        const int n_tok = int(na / n);
        const DotKernels& k = dot_kernels(isa_from(isa));
        if (!k.rows[type]) throw MinferError(strfmt("vec_dot_rows: no %s rows kernel for %s", isa_name(k.isa), type_traits(type).name));
        const size_t rb = ab.n / size_t(n_tok);
        int64_t n_sc;
        const std::vector<float> sc = act_scale_rows(vec_dot_type(type), ab.p, rb, n, n_tok, &n_sc);
        std::vector<float> out(static_cast<size_t>(n_tok));
        k.rows[type](n, wb.p, ab.p, rb, sc.data(), size_t(n_sc), n_tok, out.data());
        return out;
    }, py::arg("type"), py::arg("w"), py::arg("a"), py::arg("isa") = py::none());
    // w: R (4 or 8) weight rows, contiguous; a: the tile's token counts of activation rows; out[token][row]
    auto tile = [](uint32_t type, const py::array& w, const py::array& a, const py::object& isa, int R) {
        const char* name = R == 8 ? "vec_dot_tile8" : "vec_dot_tile4";
        Bytes wb = bytes_of(w, "w"), ab = bytes_of(a, "a");
        int64_t nr = values_in(type, wb.n, "tile weights"), n = nr / R;
        int64_t na = values_in(vec_dot_type(type), ab.n, "tile activations");
        const DotKernels& k = dot_kernels(isa_from(isa));
        const bool t16 = k.tile16[type];
        if (nr % R || n % type_traits(type).block_size ||
            ((R == 4 && na != n) && na != 2 * n && na != 4 * n && na != 8 * n && !(t16 && na == 16 * n)))
            throw MinferError(strfmt("%s: weights hold %lld values (%d rows), activations %lld (want %s2, 4 or 8 rows, "
                                     "16 where the tile takes them)", name, (long long)nr, R, (long long)na,
                                     R == 4 ? "1, " : ""));
        const int n_tok = int(na / n);
        const vec_dot_tile4_fn fn = R == 8 ? k.tile8[type] : k.tile4[type];
        if (!fn) throw MinferError(strfmt("%s: no %s tile kernel for %s", name, isa_name(k.isa), type_traits(type).name));
        const size_t rb = ab.n / size_t(n_tok);
        int64_t n_sc;
        const std::vector<float> sc = act_scale_rows(vec_dot_type(type), ab.p, rb, n, n_tok, &n_sc);
        py::array_t<float> out({py::ssize_t(n_tok), py::ssize_t(R)});
        fn(n, wb.p, wb.n / size_t(R), ab.p, rb, sc.data(), size_t(n_sc), n_tok, true, out.mutable_data());
        return out;
    };
    m.def("vec_dot_tile4", [tile](uint32_t type, const py::array& w, const py::array& a, const py::object& isa) {
        return tile(type, w, a, isa, 4);
    }, py::arg("type"), py::arg("w"), py::arg("a"), py::arg("isa") = py::none());
    m.def("vec_dot_tile8", [tile](uint32_t type, const py::array& w, const py::array& a, const py::object& isa) {
        return tile(type, w, a, isa, 8);
    }, py::arg("type"), py::arg("w"), py::arg("a"), py::arg("isa") = py::none());
    m.def("has_dot_tile8", [](uint32_t type, const py::object& isa) { return dot_kernels(isa_from(isa)).tile8[type] != nullptr; },
          py::arg("type"), py::arg("isa") = py::none());
    m.def("has_dot_tile16", [](uint32_t type, const py::object& isa) { return dot_kernels(isa_from(isa)).tile16[type]; },
          py::arg("type"), py::arg("isa") = py::none());
    m.def("has_dot_tile4", [](uint32_t type, const py::object& isa) { return dot_kernels(isa_from(isa)).tile4[type] != nullptr; },
          py::arg("type"), py::arg("isa") = py::none());
    m.def("has_dot_rows", [](uint32_t type, const py::object& isa) { return dot_kernels(isa_from(isa)).rows[type] != nullptr; },
          py::arg("type"), py::arg("isa") = py::none());
    m.def("default_isa", [] { return isa_name(default_isa()); });
    m.def("available_isas", [] {
        py::list out;
        for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon})
            if (isa_supported(isa)) out.append(isa_name(isa));
        return out;
    }, "ISAs compiled into this build and supported by this CPU");
}

}  // namespace minfer
