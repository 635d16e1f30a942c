// The Metal entry points of a build without Metal (every non-Apple platform).
#include "backends/metal/metal_api.h"
#include "common/error.h"

namespace minfer {

MetalDeviceInfo metal_device_info() {
    MetalDeviceInfo info;
    info.reason = "this build of minfer has no Metal backend (Metal exists on macOS only)";
    return info;
}

std::unique_ptr<Backend> make_metal_backend(const WeightStore*) { throw MinferError(metal_device_info().reason); }

}  // namespace minfer
