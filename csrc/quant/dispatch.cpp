// Run-time choice of the dot-product kernels: every ISA this build compiled is
// available, the best one the CPU supports is the default, and MINFER_CPU_ISA
// overrides it (for tests and benchmarks).  Asking for an ISA the CPU lacks is an
// error, never a silent downgrade.
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/error.h"
#include "common/settings.h"
#include "quant/quant.h"

namespace minfer {

#ifndef MINFER_HAVE_AVX2
const DotKernels* dot_kernels_avx2() { return nullptr; }
#endif
#ifndef MINFER_HAVE_AVX512
const DotKernels* dot_kernels_avx512() { return nullptr; }
#endif
#ifndef MINFER_HAVE_NEON
const DotKernels* dot_kernels_neon() { return nullptr; }
#endif

DotKernels make_dot_table(Isa isa, const DotFns& f) {
    DotKernels t;
    t.isa = isa;
    t.quantize = quantize_row_act;
    t.swiglu = swiglu_row_ref;
    t.geglu = geglu_row_ref;
    for (auto& fn : t.dot) fn = nullptr;
    for (auto& fn : t.rows) fn = nullptr;
    for (auto& fn : t.tile4) fn = nullptr;
    for (auto& b : t.tile16) b = false;
    for (auto& fn : t.tile8) fn = nullptr;
    t.dot[GGML_TYPE_F32] = f.f32;
    t.dot[GGML_TYPE_F16] = f.f16;
    t.dot[GGML_TYPE_BF16] = f.bf16;
    t.dot[GGML_TYPE_Q4_0] = f.q4_0;
    t.dot[GGML_TYPE_Q5_0] = f.q5_0;
    t.dot[GGML_TYPE_Q8_0] = f.q8_0;
    t.dot[GGML_TYPE_Q4_1] = f.q4_1;
    t.dot[GGML_TYPE_Q5_1] = f.q5_1;
    t.dot[GGML_TYPE_Q2_K] = f.q2_K;
    t.dot[GGML_TYPE_Q3_K] = f.q3_K;
    t.dot[GGML_TYPE_Q4_K] = f.q4_K;
    t.dot[GGML_TYPE_Q5_K] = f.q5_K;
    t.dot[GGML_TYPE_Q6_K] = f.q6_K;
    t.dot[GGML_TYPE_IQ4_NL] = f.iq4_nl;
    t.dot[GGML_TYPE_IQ4_XS] = f.iq4_xs;
    return t;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::scalar: return "scalar";
        case Isa::avx2: return "avx2";
        case Isa::avx512: return "avx512";
        case Isa::neon: return "neon";
    }
    return "?";
}

#if defined(__x86_64__) || defined(__i386__)
// F16C by cpuid (leaf 1, ecx bit 29): not every compiler's __builtin_cpu_supports knows it.
static bool has_f16c() {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static bool cpu_has(Isa isa) {
    switch (isa) {
        case Isa::scalar: return true;
#if defined(__x86_64__) || defined(__i386__)
        // __builtin_cpu_supports also checks that the OS saves the wide registers.
        case Isa::avx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
        case Isa::avx512:
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
#if defined(__aarch64__) && defined(__linux__)
        case Isa::neon: return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;  // the dot-product extension
#elif defined(__aarch64__)
        case Isa::neon: return true;  // Apple Silicon: every M-series core has it
#endif
        default: return false;
    }
}

// Whether this build compiled the ISA's kernels.  Checked without touching the
// tables: building a table runs code of its ISA (its TU is compiled for it).
static bool compiled_in(Isa isa) {
    switch (isa) {
        case Isa::scalar: return true;
#ifdef MINFER_HAVE_AVX2
        case Isa::avx2: return true;
#endif
#ifdef MINFER_HAVE_AVX512
        case Isa::avx512: return true;
#endif
#ifdef MINFER_HAVE_NEON
        case Isa::neon: return true;
#endif
        default: return false;
    }
}

static const DotKernels* table_for(Isa isa) {
    switch (isa) {
        case Isa::scalar: return dot_kernels_scalar();
        case Isa::avx2: return dot_kernels_avx2();
        case Isa::avx512: return dot_kernels_avx512();
        case Isa::neon: return dot_kernels_neon();
    }
    return nullptr;
}

bool isa_supported(Isa isa) { return compiled_in(isa) && cpu_has(isa); }

const DotKernels& dot_kernels(Isa isa) {
    if (!compiled_in(isa)) throw MinferError(strfmt("CPU ISA '%s' was not compiled into this build of minfer", isa_name(isa)));
    if (!cpu_has(isa)) throw MinferError(strfmt("CPU ISA '%s' is not supported by this CPU", isa_name(isa)));
    return *table_for(isa);
}

Isa default_isa() {
    const std::string want = setting_text("MINFER_CPU_ISA");
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon})
        if (want == isa_name(isa)) {
            dot_kernels(isa);  // throws with the reason if unavailable
            return isa;
        }
    for (Isa isa : {Isa::avx512, Isa::avx2, Isa::neon})
        if (isa_supported(isa)) return isa;
    return Isa::scalar;
}

}  // namespace minfer
