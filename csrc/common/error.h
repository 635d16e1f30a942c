// Errors minfer raises.  Every failure that a user can cause (a bad file, a bad
// argument) is one of these, with a message that names the thing and the numbers;
// the bindings turn them into minfer.MinferError / minfer.GGUFError in Python.
#pragma once
#include <cstdarg>
#include <stdexcept>
#include <string>

namespace minfer {

// Messages quote names read from files, which need not be valid UTF-8: the
// constructor replaces invalid bytes with '?' so Python can always show them.
std::string valid_utf8(const std::string& s);

struct MinferError : std::runtime_error {
    explicit MinferError(const std::string& msg) : std::runtime_error(valid_utf8(msg)) {}
};

// A GGUF file that is malformed, truncated or hostile.
struct GGUFError : MinferError {
    using MinferError::MinferError;
};

// A well-formed file that is not a model minfer can run: unsupported
// architecture or tensor type, a missing tensor, shapes that contradict the
// metadata.
struct ModelError : MinferError {
    using MinferError::MinferError;
};

// A KV cache or buffer larger than the memory this process may take (checked
// up front; Python: minfer.OutOfMemoryError, also a MemoryError).
struct OutOfMemoryError : MinferError {
    using MinferError::MinferError;
};

// printf-style message builder for the errors above.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace minfer
