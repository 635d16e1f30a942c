// The KV cache: per layer, two persistent regions on the backend that runs the
// layer's KvStore/Attn.  It outlives graphs: the prompt's graph fills it and
// every decode step's graph reads and extends it.
#pragma once
#include <cstdint>
#include <vector>

namespace minfer {

struct KvRegion {
    int backend = -1;  // index into the engine's backend list
    int k = -1, v = -1;
    int ring = 0;      // the layer's kv_ring (0: n_ctx rows)
    size_t bytes = 0;  // of k, and of v
};

struct KvCache {
    uint32_t type = 1;  // F16
    int n_ctx = 0;
    int n_ctx_local = 0;  // a batch pool's rows for sliding-window layers, where they have a pool of their own
    std::vector<KvRegion> layers;
};

}  // namespace minfer
