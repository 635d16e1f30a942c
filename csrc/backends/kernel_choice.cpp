#include "backends/kernel_choice.h"

#include <atomic>
#include <map>
#include <mutex>

#include "common/error.h"
#include "common/settings.h"

namespace minfer {

namespace {

const std::vector<KernelChoiceSpec> kChoices = {
    {"cuda.decode_activations", "q8|f32", "decode's matvec activations: rounded to 8-bit blocks, or kept f32"},
    {"cuda.matvec", "warp|block", "one-row matvec: a warp a weight row, or the block kernel (8 rows sharing x)"},
    {"cuda.matvec_pipe", "0|1|all", "the pipe kernel: never, for launches with Q4_K parts, or also Q6_K alone"},
    {"cuda.pipe_ahead", "1|2|whole", "how far ahead the pipe kernel loads: 1 or 2 chunks, or a lane's whole row"},
    {"cuda.matvec_stage", "off|before", "whether the block kernel stages its rows in shared memory before its wait"},
    {"cuda.matvec_stream", "0|only", "the stream kernel: never, or wherever it can run (an error elsewhere)"},
    {"cuda.stream_ahead", "1|2", "how many Q4_K chunks ahead the stream kernel loads"},
    {"cuda.matvec_spread", "0|1|only", "spread rows over whole waves: never, wherever it can, or an error elsewhere"},
    {"cuda.qkv_rope", "0|1|epilogue",
     "RoPE + KV store: a node of its own, fused into the q/k/v projection, or fused with an error where the "
     "matvec's epilogue cannot take it"},
    {"cuda.norm_pdl", "release|wait|wait-attn|wait-ffn",
     "whether decode's add + norm lets the next kernel start before its own wait: always, never, or never "
     "before the attention's / the FFN's projections only"},
    {"cuda.attention", "general|warp",
     "decode attention through the general kernel, or the warp kernels (a block per query head) where the "
     "tensor-core kernel for a KV head's query heads would run"},
    {"cuda.attention_merge", "cluster|combine", "decode attention's splits merged by a block cluster or a second launch"},
    {"cuda.batch_matmul", "matvec|int8|bf16|f16",
     "a batch step's products (2-64 rows): the 8-bit matvec streaming each weight once for two rows, int8 "
     "tensor cores on 8-bit activations, bf16 ones on shared-memory stages, or f16 on dequantized slices"},
    {"cuda.attention_group", "1|all", "a batch's paged decode attention: a block per query head, or per KV head"},
    {"cpu.attention", "f32|tiles",
     "attention on the vector units in f32 a (row, head) at a time, or in f32 on AVX-512 register tiles (an "
     "error where the CPU, the session's ISA tier or the head size cannot take it)"},
    {"metal.matmul", "matvec|rows|simdgroup", "one matmul tier for every row count"},
    {"metal.attention", "flash|split", "the single-pass flash kernel or the split kernel with a combine"},
};

std::mutex mu;
std::map<std::string, std::string> forced;
std::atomic<bool> any_forced{false};  // launches ask on every call: no lock while nothing is forced

const KernelChoiceSpec& spec(const std::string& name) {
    for (const KernelChoiceSpec& c : kChoices)
        if (name == c.name) return c;
    std::string names;
    for (const KernelChoiceSpec& c : kChoices) names += std::string(names.empty() ? "" : ", ") + c.name;
    throw MinferError(strfmt("no kernel choice named '%s' (the choices: %s)", name.c_str(), names.c_str()));
}

}  // namespace

const std::vector<KernelChoiceSpec>& kernel_choices() { return kChoices; }

void force_kernel(const std::string& choice, const std::string& value) {
    const KernelChoiceSpec& c = spec(choice);
    std::lock_guard<std::mutex> lock(mu);
    if (value == "auto") {
        forced.erase(choice);
        any_forced = !forced.empty();
        return;
    }
    if (!one_of(c.allowed, value))
        throw MinferError(strfmt("kernel choice %s='%s': must be auto or one of %s", choice.c_str(), value.c_str(),
                                 listed(c.allowed).c_str()));
    forced[choice] = value;
    any_forced = true;
}

std::string forced_kernel(const char* choice) {
    if (!any_forced) return {};
    std::lock_guard<std::mutex> lock(mu);
    auto it = forced.find(choice);
    return it == forced.end() ? std::string() : it->second;
}

}  // namespace minfer
