// Environment levers the GPU backends share, parsed one way with one kind of
// error: an op list ("Rope,Add": ops left to the CPU, for mixed graphs) and a
// wait bound in seconds.
#pragma once
#include <set>

#include "graph/ir.h"

namespace minfer {

// The ops named in $var (comma-separated op names); empty if unset.  MinferError "VAR: unknown op 'X'".
std::set<Op> ops_from_env(const char* var);

// $var as a positive number of seconds, or `fallback` if unset.  MinferError for anything else.
double seconds_from_env(const char* var, double fallback);

}  // namespace minfer
