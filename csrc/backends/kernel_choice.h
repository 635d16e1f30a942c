// Kernel choice is code: each backend's dispatch picks a kernel from shapes, types and device properties.
// Tests that must exercise a path the rules would not take force it through this one hook
// (Python: minfer.engine.force_kernel), never through the environment.  A forced choice is read on the
// host when a kernel is launched, so a captured CUDA graph keeps the choice it was captured with.
// Reference: tests/test_kernel_choice.py (the hook itself); the backends' tests use it to reach each path.
#pragma once
#include <string>
#include <vector>

namespace minfer {

struct KernelChoiceSpec {
    const char* name;     // "<backend>.<decision>", e.g. "cuda.matvec"
    const char* allowed;  // "a|b|c" (besides "auto": the dispatch rule)
    const char* meaning;  // what each value forces
};

const std::vector<KernelChoiceSpec>& kernel_choices();

// Forces `choice` to `value`, or back to its rule with "auto".  MinferError for an unknown choice or value.
void force_kernel(const std::string& choice, const std::string& value);

// The forced value of `choice`, or "" where its rule decides.
std::string forced_kernel(const char* choice);

}  // namespace minfer
