// The registry: every architecture minfer runs, one line each.
#include "models/architecture.h"

namespace minfer {

extern const Architecture kLlama, kQwen2, kQwen3, kGemma3;

namespace {
const Architecture* const kArchitectures[] = {&kLlama, &kQwen2, &kQwen3, &kGemma3};
}  // namespace

const Architecture* find_architecture(const std::string& name) {
    for (const Architecture* a : kArchitectures)
        if (name == a->name) return a;
    return nullptr;
}

std::string architecture_names() {
    std::string out;
    for (const Architecture* a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a->name);
    return out;
}

}  // namespace minfer
