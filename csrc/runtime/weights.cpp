#include "runtime/weights.h"

#include "common/error.h"

namespace minfer {

WeightStore::WeightStore(std::shared_ptr<GGUF> gguf) : gguf_(std::move(gguf)) {
    for (const GGUFTensor& t : gguf_->tensors())
        weights_[t.name] = Weight{t.name, t.type, t.dims, t.data, size_t(t.nbytes)};
}

const Weight& WeightStore::get(const std::string& name) const {
    auto it = weights_.find(name);
    if (it == weights_.end())
        throw ModelError(strfmt("model '%s' has no tensor '%s'", gguf_->paths()[0].c_str(), name.c_str()));
    return it->second;
}

}  // namespace minfer
