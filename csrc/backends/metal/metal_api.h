// What the rest of minfer sees of the Metal backend: whether a device is
// there, and a factory.  Plain C++, so the session compiles the same on every
// platform; builds without Metal (every non-Apple build) link metal_stub.cpp.
#pragma once
#include <memory>
#include <string>

#include "backends/backend.h"
#include "runtime/weights.h"

namespace minfer {

struct MetalDeviceInfo {
    bool built = false;      // compiled with the Metal backend (macOS)
    bool available = false;  // ... a device is present and the kernel library loads
    std::string reason;      // why not
    std::string name;        // e.g. "Apple M2 Pro"
};
MetalDeviceInfo metal_device_info();

// Registers every weight (zero-copy over the mapped file where the OS allows,
// else copied) and returns the backend; throws with the reason if Metal is not usable.
std::unique_ptr<Backend> make_metal_backend(const WeightStore* weights);

}  // namespace minfer
