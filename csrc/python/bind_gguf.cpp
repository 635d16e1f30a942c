// minfer._minfer.GGUFFile: the reader's view of a file, metadata as Python
// values, tensors as zero-copy numpy views that keep the mapping alive.
#include <cstring>

#include "common/error.h"
#include "gguf/gguf.h"
#include "python/bindings.h"
#include "quant/types.h"

namespace py = pybind11;

namespace minfer {

namespace {

py::object str_from(std::string_view s) {
    // GGUF strings should be UTF-8; a hostile or odd file must not make this throw.
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(o);
}

template <typename T>
py::list list_of(const uint8_t* p, uint64_t n) {
    py::list out(n);
    for (uint64_t k = 0; k < n; k++) {
        T v;
        std::memcpy(&v, p + k * sizeof(T), sizeof(T));
        out[k] = py::cast(v);
    }
    return out;
}

py::object to_python(const GGUFValue& v) {
    switch (v.type) {
        case GGUFType::UINT8: case GGUFType::UINT16: case GGUFType::UINT32: case GGUFType::UINT64:
            return py::int_(v.u);
        case GGUFType::INT8: case GGUFType::INT16: case GGUFType::INT32: case GGUFType::INT64:
            return py::int_(v.i);
        case GGUFType::FLOAT32: case GGUFType::FLOAT64: return py::float_(v.f);
        case GGUFType::BOOL: return py::bool_(v.u != 0);
        case GGUFType::STRING: return str_from(v.str);
        case GGUFType::ARRAY: break;
    }
    switch (v.elem_type) {
        case GGUFType::UINT8: return list_of<uint8_t>(v.elems, v.count);
        case GGUFType::INT8: return list_of<int8_t>(v.elems, v.count);
        case GGUFType::UINT16: return list_of<uint16_t>(v.elems, v.count);
        case GGUFType::INT16: return list_of<int16_t>(v.elems, v.count);
        case GGUFType::UINT32: return list_of<uint32_t>(v.elems, v.count);
        case GGUFType::INT32: return list_of<int32_t>(v.elems, v.count);
        case GGUFType::UINT64: return list_of<uint64_t>(v.elems, v.count);
        case GGUFType::INT64: return list_of<int64_t>(v.elems, v.count);
        case GGUFType::FLOAT32: return list_of<float>(v.elems, v.count);
        case GGUFType::FLOAT64: return list_of<double>(v.elems, v.count);
        case GGUFType::BOOL: return list_of<bool>(v.elems, v.count);
        case GGUFType::STRING: {
            py::list out(v.strs.size());
            for (size_t k = 0; k < v.strs.size(); k++) out[k] = str_from(v.strs[k]);
            return out;
        }
        case GGUFType::ARRAY: {
            py::list out(v.items.size());
            for (size_t k = 0; k < v.items.size(); k++) out[k] = to_python(v.items[k]);
            return out;
        }
    }
    return py::none();
}

// A numpy view of a tensor's bytes.  numpy shape is the GGUF dims reversed
// (ne[0] is the contiguous one); block types are uint8 [..., row_bytes].
py::array tensor_view(const std::shared_ptr<GGUF>& g, const GGUFTensor& t) {
    // The capsule owns a reference to the file that holds the data.
    auto* keep = new std::shared_ptr<MappedFile>(g->files()[size_t(t.file)]);
    py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<MappedFile>*>(p); });
    std::vector<py::ssize_t> shape(t.dims.rbegin(), t.dims.rend());
    py::dtype dtype;
    switch (t.type) {
        case GGML_TYPE_F32: dtype = py::dtype::of<float>(); break;
        case GGML_TYPE_F16: dtype = py::dtype("float16"); break;
        case GGML_TYPE_F64: dtype = py::dtype::of<double>(); break;
        case GGML_TYPE_I8: dtype = py::dtype::of<int8_t>(); break;
        case GGML_TYPE_I16: dtype = py::dtype::of<int16_t>(); break;
        case GGML_TYPE_BF16: dtype = py::dtype::of<uint16_t>(); break;  // raw bits: numpy has no bfloat16
        case GGML_TYPE_I32: dtype = py::dtype::of<int32_t>(); break;
        case GGML_TYPE_I64: dtype = py::dtype::of<int64_t>(); break;
        default:
            dtype = py::dtype::of<uint8_t>();
            shape.back() = py::ssize_t(row_size(t.type, t.dims[0]));
    }
    py::array a(dtype, shape, {}, t.data, base);
    // read-only: the mapping is PROT_READ, a write would fault
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
}

}  // namespace

void bind_gguf(py::module_& m) {
    py::class_<GGUFTensor>(m, "GGUFTensorInfo")
        .def_readonly("name", &GGUFTensor::name)
        .def_readonly("type", &GGUFTensor::type)
        .def_property_readonly("type_name", [](const GGUFTensor& t) { return type_traits(t.type).name; })
        .def_property_readonly("shape", [](const GGUFTensor& t) {
            return py::tuple(py::cast(std::vector<int64_t>(t.dims.rbegin(), t.dims.rend())));
        })
        .def_readonly("dims", &GGUFTensor::dims, "GGUF order: dims[0] is the contiguous one")
        .def_readonly("offset", &GGUFTensor::offset, "offset within its file's data section")
        .def_readonly("nbytes", &GGUFTensor::nbytes)
        .def_readonly("file", &GGUFTensor::file, "index of the split file that holds it")
        .def_property_readonly("n_elements", &GGUFTensor::n_elements)
        .def("__repr__", [](const GGUFTensor& t) {
            std::string dims;
            for (size_t k = 0; k < t.dims.size(); k++) dims += (k ? ", " : "") + std::to_string(t.dims[k]);
            return strfmt("<GGUFTensorInfo %s %s [%s]>", t.name.c_str(), type_traits(t.type).name, dims.c_str());
        });

    py::class_<GGUF, std::shared_ptr<GGUF>>(m, "GGUFFile")
        .def(py::init([](const std::string& path) { return GGUF::open(path); }), py::arg("path"))
        .def_property_readonly("version", &GGUF::version)
        .def_property_readonly("alignment", &GGUF::alignment)
        .def_property_readonly("paths", &GGUF::paths)
        .def("data_offset", &GGUF::data_offset, py::arg("file") = 0,
             "absolute file offset where the tensor data of split `file` starts")
        .def("metadata", [](const GGUF& g) {
            py::dict d;
            for (auto& [k, v] : g.metadata()) d[str_from(k)] = to_python(v);
            return d;
        })
        .def("metadata_types", [](const GGUF& g) {
            py::dict d;
            for (auto& [k, v] : g.metadata()) {
                std::string t = gguf_type_name(v.type);
                if (v.type == GGUFType::ARRAY) t += std::string("[") + gguf_type_name(v.elem_type) + "]";
                d[str_from(k)] = t;
            }
            return d;
        })
        .def("tensor_infos", [](const GGUF& g) { return g.tensors(); })
        .def("tensor_data", [](const std::shared_ptr<GGUF>& g, const std::string& name) {
            const GGUFTensor* t = g->find_tensor(name);
            if (!t) throw py::key_error("no tensor named '" + name + "'");
            return tensor_view(g, *t);
        }, py::arg("name"));
}

}  // namespace minfer
