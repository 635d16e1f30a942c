// libFuzzer target: the GGUF reader and the model loader on arbitrary bytes.
// Any input must either parse or throw MinferError; a crash, a hang or a
// sanitizer report is a bug.  Build and run: tests/fuzz/run.sh.
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "gguf/gguf.h"
#include "models/config.h"
#include "runtime/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto g = minfer::GGUF::from_memory("fuzz.gguf", data, size);
        // touch everything the loader reads: metadata values, tensor bytes
        size_t sum = 0;
        for (auto& [k, v] : g->metadata()) sum += k.size() + v.str.size() + v.strs.size() + v.items.size();
        for (const auto& t : g->tensors())
            if (t.nbytes) sum += t.data[0] + t.data[t.nbytes - 1];
        minfer::WeightStore w(g);
        minfer::ModelConfig::from_gguf(w);
        (void)sum;
    } catch (const minfer::MinferError&) {
    }
    return 0;
}
