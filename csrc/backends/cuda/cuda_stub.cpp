// The CUDA entry points of a build without the CUDA toolkit: no device, and why.
#include "backends/cuda/cuda_api.h"
#include "common/error.h"

namespace minfer {

CudaDeviceInfo cuda_device_info() {
    CudaDeviceInfo info;
    info.reason = "this build of minfer has no CUDA backend (no CUDA compiler was found when it was built; "
                  "reinstall with nvcc on the PATH, or -DMINFER_CUDA=ON to require it)";
    return info;
}

std::vector<std::string> cuda_unsupported_weights(const WeightStore&) { return {}; }

std::unique_ptr<Backend> make_cuda_backend(const WeightStore*, size_t) {
    throw MinferError(cuda_device_info().reason);
}

std::vector<float> cuda_matmul(uint32_t, const uint8_t*, size_t, int64_t, int64_t, const float*, int, int, double*,
                               const std::string&) {
    throw MinferError(cuda_device_info().reason);
}

double cuda_copy_bandwidth(size_t, int) { throw MinferError(cuda_device_info().reason); }

std::vector<int> cuda_argmax(const float*, int, int, int, const uint32_t*, bool*) {
    throw MinferError(cuda_device_info().reason);
}
void cuda_top_k(const float*, int, int, int, float*, int32_t*, bool*, int, double*) {
    throw MinferError(cuda_device_info().reason);
}

std::map<std::string, long> cuda_launch_counts() { return {}; }  // no backend, no launches

}  // namespace minfer
