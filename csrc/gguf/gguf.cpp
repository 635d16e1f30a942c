#include "gguf/gguf.h"

#include <cstring>
#include <cstdlib>

#include "common/error.h"
#include "quant/types.h"

namespace minfer {

namespace {

constexpr uint32_t kMaxDims = 4;         // ggml tensors have at most 4 dimensions
constexpr int kMaxArrayDepth = 8;        // arrays of arrays of ... (hostile nesting)

size_t scalar_size(GGUFType t) {
    switch (t) {
        case GGUFType::UINT8: case GGUFType::INT8: case GGUFType::BOOL: return 1;
        case GGUFType::UINT16: case GGUFType::INT16: return 2;
        case GGUFType::UINT32: case GGUFType::INT32: case GGUFType::FLOAT32: return 4;
        case GGUFType::UINT64: case GGUFType::INT64: case GGUFType::FLOAT64: return 8;
        default: return 0;  // STRING, ARRAY: variable
    }
}

// A bounds-checked cursor over one mapped file.
struct Cursor {
    const MappedFile& file;
    size_t pos = 0;

    [[noreturn]] void fail(const std::string& msg) const {
        throw GGUFError(strfmt("GGUF file '%s': %s", file.path().c_str(), msg.c_str()));
    }
    size_t left() const { return file.size() - pos; }
    void need(uint64_t n, const std::string& what) const {
        if (n > left())
            fail(strfmt("truncated: %s needs %llu bytes at offset %zu but only %zu remain (file size %zu)",
                        what.c_str(), (unsigned long long)n, pos, left(), file.size()));
    }
    template <typename T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, file.data() + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    std::string_view read_string(const std::string& what) {
        uint64_t len = read<uint64_t>(what + " length");
        if (len > left())
            fail(strfmt("%s length %llu at offset %zu runs past the end of the file (%zu bytes remain)",
                        what.c_str(), (unsigned long long)len, pos - 8, left()));
        std::string_view s((const char*)file.data() + pos, size_t(len));
        pos += size_t(len);
        return s;
    }
};

GGUFValue read_value(Cursor& c, GGUFType type, const std::string& what, int depth) {
    GGUFValue v;
    v.type = type;
    switch (type) {
        case GGUFType::UINT8: v.u = c.read<uint8_t>(what); break;
        case GGUFType::INT8: v.i = c.read<int8_t>(what); break;
        case GGUFType::UINT16: v.u = c.read<uint16_t>(what); break;
        case GGUFType::INT16: v.i = c.read<int16_t>(what); break;
        case GGUFType::UINT32: v.u = c.read<uint32_t>(what); break;
        case GGUFType::INT32: v.i = c.read<int32_t>(what); break;
        case GGUFType::UINT64: v.u = c.read<uint64_t>(what); break;
        case GGUFType::INT64: v.i = c.read<int64_t>(what); break;
        case GGUFType::FLOAT32: v.f = c.read<float>(what); break;
        case GGUFType::FLOAT64: v.f = c.read<double>(what); break;
        case GGUFType::BOOL: {
            uint8_t b = c.read<uint8_t>(what);
            if (b > 1) c.fail(strfmt("%s: bool value %u is neither 0 nor 1", what.c_str(), b));
            v.u = b;
            break;
        }
        case GGUFType::STRING: v.str = c.read_string(what); break;
        case GGUFType::ARRAY: {
            if (depth >= kMaxArrayDepth)
                c.fail(strfmt("%s: arrays nested deeper than %d", what.c_str(), kMaxArrayDepth));
            uint32_t et = c.read<uint32_t>(what + " array element type");
            if (et > uint32_t(GGUFType::FLOAT64))
                c.fail(strfmt("%s: unknown array element type %u", what.c_str(), et));
            v.elem_type = GGUFType(et);
            v.count = c.read<uint64_t>(what + " array length");
            // Every element takes at least this many bytes: reject counts the file cannot hold
            // before allocating anything for them.
            size_t min_elem = scalar_size(v.elem_type);
            if (v.elem_type == GGUFType::STRING) min_elem = 8;
            if (v.elem_type == GGUFType::ARRAY) min_elem = 12;
            if (v.count > c.left() / min_elem)
                c.fail(strfmt("%s: array of %llu %s elements (>= %zu bytes each) at offset %zu does not fit in "
                              "the %zu bytes that remain",
                              what.c_str(), (unsigned long long)v.count, gguf_type_name(v.elem_type), min_elem,
                              c.pos - 12, c.left()));
            if (v.elem_type == GGUFType::STRING) {
                v.strs.reserve(size_t(v.count));
                for (uint64_t k = 0; k < v.count; k++)
                    v.strs.push_back(c.read_string(strfmt("%s[%llu]", what.c_str(), (unsigned long long)k)));
            } else if (v.elem_type == GGUFType::ARRAY) {
                v.items.reserve(size_t(v.count));
                for (uint64_t k = 0; k < v.count; k++)
                    v.items.push_back(read_value(c, GGUFType::ARRAY,
                                                 strfmt("%s[%llu]", what.c_str(), (unsigned long long)k), depth + 1));
            } else {
                if (v.elem_type == GGUFType::BOOL)
                    for (uint64_t k = 0; k < v.count; k++)
                        if (c.file.data()[c.pos + k] > 1)
                            c.fail(strfmt("%s[%llu]: bool value %u is neither 0 nor 1", what.c_str(),
                                          (unsigned long long)k, c.file.data()[c.pos + k]));
                v.elems = c.file.data() + c.pos;
                c.pos += size_t(v.count) * min_elem;
            }
            break;
        }
        default:
            c.fail(strfmt("%s: unknown value type %u", what.c_str(), uint32_t(type)));
    }
    return v;
}

uint64_t read_u64_meta(const std::vector<std::pair<std::string, GGUFValue>>& kv, const std::string& key,
                       bool* found) {
    for (auto& [k, v] : kv)
        if (k == key) {
            *found = true;
            if (v.type == GGUFType::UINT8 || v.type == GGUFType::UINT16 || v.type == GGUFType::UINT32 ||
                v.type == GGUFType::UINT64)
                return v.u;
            if (v.type == GGUFType::INT8 || v.type == GGUFType::INT16 || v.type == GGUFType::INT32 ||
                v.type == GGUFType::INT64)
                return v.i < 0 ? UINT64_MAX : uint64_t(v.i);
            return UINT64_MAX;
        }
    *found = false;
    return 0;
}

}  // namespace

const char* gguf_type_name(GGUFType t) {
    static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return uint32_t(t) <= 12 ? names[uint32_t(t)] : "unknown";
}

int64_t GGUFTensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
}

void GGUF::parse_file(int index) {
    const MappedFile& f = *files_[size_t(index)];
    Cursor c{f};
    c.need(4, "magic");
    if (std::memcmp(f.data(), "GGUF", 4) != 0)
        c.fail(strfmt("bad magic 0x%02x%02x%02x%02x (expected \"GGUF\")", f.data()[0], f.data()[1], f.data()[2],
                      f.data()[3]));
    c.pos = 4;
    uint32_t version = c.read<uint32_t>("version");
    if (version == 1) c.fail("version 1 is not supported (only GGUF v2 and v3)");
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && version != 0)
            c.fail(strfmt("version field 0x%08x looks byte-swapped: big-endian GGUF files are not supported", version));
        c.fail(strfmt("unsupported version %u (only 2 and 3)", version));
    }
    uint64_t n_tensors = c.read<uint64_t>("tensor count");
    uint64_t n_kv = c.read<uint64_t>("metadata count");
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes;
    // a tensor info at least 8 + 4 + 4 + 8.
    if (n_kv > c.left() / 13)
        c.fail(strfmt("metadata count %llu cannot fit in the %zu bytes that follow the header",
                      (unsigned long long)n_kv, c.left()));
    if (n_tensors > c.left() / 24)
        c.fail(strfmt("tensor count %llu cannot fit in the %zu bytes that follow the header",
                      (unsigned long long)n_tensors, c.left()));

    std::vector<std::pair<std::string, GGUFValue>> kv;
    std::map<std::string, size_t> kv_index;
    kv.reserve(size_t(n_kv));
    for (uint64_t k = 0; k < n_kv; k++) {
        std::string what = strfmt("metadata #%llu key", (unsigned long long)k);
        std::string key(c.read_string(what));
        if (key.empty()) c.fail(strfmt("metadata #%llu has an empty key", (unsigned long long)k));
        if (kv_index.count(key)) c.fail(strfmt("duplicate metadata key '%s' (#%llu)", key.c_str(), (unsigned long long)k));
        uint32_t t = c.read<uint32_t>(strfmt("type of metadata '%s'", key.c_str()));
        if (t > uint32_t(GGUFType::FLOAT64)) c.fail(strfmt("metadata '%s' has unknown value type %u", key.c_str(), t));
        GGUFValue v = read_value(c, GGUFType(t), strfmt("metadata '%s'", key.c_str()), 0);
        kv_index[key] = kv.size();
        kv.emplace_back(std::move(key), std::move(v));
    }

    uint32_t alignment = 32;
    auto it = kv_index.find("general.alignment");
    if (it != kv_index.end()) {
        const GGUFValue& a = kv[it->second].second;
        if (a.type != GGUFType::UINT32)
            c.fail(strfmt("general.alignment has type %s (expected uint32)", gguf_type_name(a.type)));
        if (a.u == 0 || (a.u & (a.u - 1)) != 0)
            c.fail(strfmt("general.alignment %llu is not a power of two", (unsigned long long)a.u));
        alignment = uint32_t(a.u);
    }

    std::vector<GGUFTensor> tensors;
    tensors.reserve(size_t(n_tensors));
    for (uint64_t k = 0; k < n_tensors; k++) {
        GGUFTensor t;
        t.file = index;
        t.name = std::string(c.read_string(strfmt("tensor #%llu name", (unsigned long long)k)));
        const char* nm = t.name.c_str();
        if (t.name.empty()) c.fail(strfmt("tensor #%llu has an empty name", (unsigned long long)k));
        uint32_t n_dims = c.read<uint32_t>(strfmt("tensor '%s' dimension count", nm));
        if (n_dims == 0 || n_dims > kMaxDims)
            c.fail(strfmt("tensor '%s' has %u dimensions (1 to %u allowed)", nm, n_dims, kMaxDims));
        int64_t n_elem = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t dim = c.read<uint64_t>(strfmt("tensor '%s' dimension %u", nm, d));
            if (dim > uint64_t(INT64_MAX))
                c.fail(strfmt("tensor '%s' dimension %u is %llu (negative as int64)", nm, d, (unsigned long long)dim));
            if (dim != 0 && uint64_t(n_elem) > uint64_t(INT64_MAX) / dim)
                c.fail(strfmt("tensor '%s': the product of its dimensions overflows int64 at dimension %u (%llu)", nm, d,
                              (unsigned long long)dim));
            n_elem *= int64_t(dim);
            t.dims.push_back(int64_t(dim));
        }
        t.type = c.read<uint32_t>(strfmt("tensor '%s' type", nm));
        const TypeTraits& tt = type_traits(t.type);
        if (!tt.known) c.fail(strfmt("tensor '%s' has unknown tensor type id %u", nm, t.type));
        if (t.dims[0] % tt.block_size != 0)
            c.fail(strfmt("tensor '%s': row length %lld is not a multiple of the %s block size %d", nm,
                          (long long)t.dims[0], tt.name, tt.block_size));
        t.offset = c.read<uint64_t>(strfmt("tensor '%s' data offset", nm));
        if (t.offset % alignment != 0)
            c.fail(strfmt("tensor '%s' data offset %llu is not a multiple of the alignment %u", nm,
                          (unsigned long long)t.offset, alignment));
        // n_elem / block * type_size cannot overflow: n_elem < 2^63 and type_size <= block * 8.
        t.nbytes = uint64_t(n_elem / tt.block_size) * uint64_t(tt.type_size);
        tensors.push_back(std::move(t));
    }

    uint64_t data_start = (uint64_t(c.pos) + alignment - 1) / alignment * alignment;
    if (n_tensors > 0 && data_start > f.size())
        c.fail(strfmt("tensor data section would start at offset %llu, past the end of the file (%zu bytes)",
                      (unsigned long long)data_start, f.size()));
    uint64_t data_size = data_start <= f.size() ? f.size() - data_start : 0;
    for (GGUFTensor& t : tensors) {
        if (t.offset > data_size || t.nbytes > data_size - t.offset)
            c.fail(strfmt("tensor '%s' data [%llu, %llu) (%llu bytes of %s) lies outside the data section of %llu "
                          "bytes (file size %zu, data starts at %llu)",
                          t.name.c_str(), (unsigned long long)t.offset, (unsigned long long)(t.offset + t.nbytes),
                          (unsigned long long)t.nbytes, type_traits(t.type).name, (unsigned long long)data_size,
                          f.size(), (unsigned long long)data_start));
        t.data = f.data() + data_start + t.offset;
        if (tensor_index_.count(t.name))
            c.fail(strfmt("duplicate tensor name '%s'", t.name.c_str()));
        tensor_index_[t.name] = tensors_.size();
        tensors_.push_back(std::move(t));
    }
    data_offsets_.push_back(data_start);

    // Split models: every file carries split.count and its 0-based split.no.
    bool has_count = false, has_no = false;
    uint64_t count = read_u64_meta(kv, "split.count", &has_count);
    uint64_t no = read_u64_meta(kv, "split.no", &has_no);
    size_t n_files = paths_.size();
    if (n_files > 1) {
        if (has_count && count != n_files)
            c.fail(strfmt("split.count is %llu but the file name says %zu splits", (unsigned long long)count, n_files));
        if (has_no && no != uint64_t(index))
            c.fail(strfmt("split.no is %llu but the file name says split %d (0-based)", (unsigned long long)no, index));
    } else if (has_count && count > 1) {
        c.fail(strfmt("file is split %llu of a %llu-file split model; open the first split "
                      "(NAME-00001-of-%05llu.gguf)",
                      (unsigned long long)no + 1, (unsigned long long)count, (unsigned long long)count));
    }

    if (index == 0) {
        version_ = version;
        alignment_ = alignment;
        kv_ = std::move(kv);
        kv_index_ = std::move(kv_index);
    }
}

// "NAME-00001-of-00003.gguf" -> (NAME, 3); false for any other name.  Parsed by
// hand: the name comes from the user, and std::regex is slow to build and has
// misbehaved where two C++ runtimes meet in one process.
static bool parse_split_name(const std::string& path, std::string* stem, int* count) {
    const std::string tail = ".gguf";
    const size_t n = path.size(), need = 1 + 5 + 4 + 5 + tail.size();  // -NNNNN-of-NNNNN.gguf
    if (n < need || path.compare(n - tail.size(), tail.size(), tail) != 0) return false;
    const size_t p = n - need;
    auto digits = [&](size_t at) {
        for (size_t i = at; i < at + 5; i++)
            if (path[i] < '0' || path[i] > '9') return false;
        return true;
    };
    if (path[p] != '-' || !digits(p + 1) || path.compare(p + 6, 4, "-of-") != 0 || !digits(p + 10)) return false;
    *stem = path.substr(0, p);
    *count = std::atoi(path.substr(p + 10, 5).c_str());
    return true;
}

std::shared_ptr<GGUF> GGUF::open(const std::string& path) {
    std::shared_ptr<GGUF> g(new GGUF());
    std::string stem;
    int count = 0;
    if (parse_split_name(path, &stem, &count)) {
        if (count < 1) throw GGUFError(strfmt("GGUF file '%s': split count %d in the name is invalid", path.c_str(), count));
        for (int i = 1; i <= count; i++) g->paths_.push_back(strfmt("%s-%05d-of-%05d.gguf", stem.c_str(), i, count));
    } else {
        g->paths_.push_back(path);
    }
    for (size_t i = 0; i < g->paths_.size(); i++) {
        g->files_.push_back(MappedFile::open(g->paths_[i]));
        g->parse_file(int(i));
    }
    if (g->paths_.size() > 1) {
        bool found = false;
        uint64_t expected = read_u64_meta(g->kv_, "split.tensors.count", &found);
        if (found && expected != g->tensors_.size())
            throw GGUFError(strfmt("GGUF split model '%s': split.tensors.count is %llu but the splits hold %zu tensors",
                                   path.c_str(), (unsigned long long)expected, g->tensors_.size()));
    }
    return g;
}

std::shared_ptr<GGUF> GGUF::from_memory(const std::string& name, const uint8_t* data, size_t size) {
    std::shared_ptr<GGUF> g(new GGUF());
    g->paths_.push_back(name);
    g->files_.push_back(MappedFile::from_memory(name, data, size));
    g->parse_file(0);
    return g;
}

const GGUFValue* GGUF::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GGUFTensor* GGUF::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace minfer
