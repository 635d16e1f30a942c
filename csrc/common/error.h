// Errors minfer raises.  Every failure that a user can cause (a bad file, a bad
// argument) is one of these, with a message that names the thing and the numbers;
// the bindings turn them into minfer.MinferError / minfer.GGUFError in Python.
#pragma once
#include <cstdarg>
#include <stdexcept>
#include <string>

namespace minfer {

struct MinferError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A GGUF file that is malformed, truncated or hostile.
struct GGUFError : MinferError {
    using MinferError::MinferError;
};

// printf-style message builder for the errors above.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace minfer
