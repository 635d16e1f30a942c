#include "backends/host_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "common/error.h"
#include "sampling/scan.h"

namespace minfer {

bool op_in_place_ok(Op op) {
    switch (op) {
        case Op::RmsNorm: case Op::QkNorm: case Op::Rope: case Op::Add: case Op::Mul:
        case Op::Silu: case Op::SwiGLU: case Op::Gelu: case Op::GeGLU: case Op::Scale: case Op::SoftCap:
            return true;
        default:
            return false;
    }
}

int Backend::argmax(int id, size_t offset, size_t n, const uint32_t* allow) {
    std::vector<float> v(n);
    read_host(id, offset, v.data(), n);
    return argmax_of_row(v.data(), n, allow);
}

int argmax_of_row(const float* x, size_t n, const uint32_t* allow) {
    const int bad = first_nan(x, int(n));
    if (bad >= 0) throw MinferError(strfmt("argmax: logit %d is NaN (the model produced NaN)", bad));
    if (allow) return first_argmax_allowed(x, int(n), allow);
    return first_argmax(x, int(n));  // the first of equal maxima, as the sampler's greedy
}

// Row r's k best by top_k (their order), their values beside them; a NaN in the row an error.
void best_of_row(const float* x, size_t n, int k, float* vals, int32_t* ids) {
    const int bad = first_nan(x, int(n));
    if (bad >= 0) throw MinferError(strfmt("top-k: logit %d is NaN (the model produced NaN)", bad));
    std::vector<int> best;
    top_k(x, int(n), k, best);
    for (int i = 0; i < k; i++) {
        ids[i] = best[size_t(i)];
        vals[i] = x[best[size_t(i)]];
    }
}

void Backend::top_k_rows(int id, size_t offset, size_t n, int rows, size_t ld, int k, float* vals, int32_t* ids) {
    std::vector<float> v(n);
    for (int r = 0; r < rows; r++) {
        read_host(id, offset + size_t(r) * ld, v.data(), n);
        best_of_row(v.data(), n, k, vals + size_t(r) * size_t(k), ids + size_t(r) * size_t(k));
    }
}

int HostBackend::alloc_buffer(size_t n) {
    for (size_t i = 0; i < free_.size(); i++)
        if (pool_[size_t(free_[i])].size == n) {
            int id = free_[i];
            free_.erase(free_.begin() + long(i));
            return id;
        }
    return alloc_fresh(n);
}

void HostBackend::free_buffer(int id) {
    if (id < 0 || size_t(id) >= pool_.size()) throw MinferError(strfmt("%s: free of unknown buffer %d", name(), id));
    if (std::find(free_.begin(), free_.end(), id) == free_.end()) free_.push_back(id);
}

int HostBackend::alloc_fresh(size_t n) {
    Buffer b;
    b.size = n ? n : 1;
    b.data.reset(static_cast<float*>(std::calloc(b.size, sizeof(float))));
    if (!b.data)
        throw OutOfMemoryError(strfmt("%s: cannot allocate a buffer of %.1f MiB", name(), double(n) * 4 / 1048576.0));
    pool_.push_back(std::move(b));
    return int(pool_.size()) - 1;
}

int HostBackend::alloc_kv(size_t bytes) { return alloc_fresh((bytes + 3) / 4); }

size_t HostBackend::buffer_size(int id) const { return pool_.at(size_t(id)).size; }

float* HostBackend::ptr(int id) {
    if (id < 0 || size_t(id) >= pool_.size()) throw MinferError(strfmt("%s: unknown buffer id %d", name(), id));
    return pool_[size_t(id)].data.get();
}

void HostBackend::read_host(int id, size_t offset, float* dst, size_t n) {
    if (offset + n > buffer_size(id))
        throw MinferError(strfmt("%s: read of [%zu, %zu) past buffer %d of %zu floats", name(), offset, offset + n, id,
                                 buffer_size(id)));
    std::memcpy(dst, ptr(id) + offset, n * sizeof(float));
}

void HostBackend::write_host(int id, size_t offset, const float* src, size_t n) {
    if (offset + n > buffer_size(id))
        throw MinferError(strfmt("%s: write of [%zu, %zu) past buffer %d of %zu floats", name(), offset, offset + n, id,
                                 buffer_size(id)));
    std::memcpy(ptr(id) + offset, src, n * sizeof(float));
}

}  // namespace minfer
