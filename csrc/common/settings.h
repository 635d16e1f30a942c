// The user settings: every MINFER_* environment variable minfer reads at run time, declared in one
// table (settings.cpp) with its type, allowed values, default and meaning.  Each is read from the
// environment once, the first time any setting is asked for, and checked strictly: an invalid value
// is a MinferError naming the variable, the value and what is allowed, raised wherever that setting
// is used.  set_setting() changes a value for this process with the same checks (the Python
// `minfer.set_setting`, and the tests).  Reference: tests/test_settings.py.
#pragma once
#include <string>
#include <vector>

namespace minfer {

enum class SettingType { Bool, Number, Choice, Text, OpList };

struct SettingSpec {
    const char* name;
    SettingType type;
    const char* allowed;  // Choice: "a|b|c"; Number: a description; else a short description
    const char* fallback; // the default, as it would be written in the environment
    const char* meaning;  // one line
    bool diagnostic;      // for developers (traces, profiles); the rest are for users
};

struct SettingValue {
    const SettingSpec* spec;
    std::string text;     // the current value, as written ("" where unset and the default is "")
    std::string source;   // "default", "environment" or "set"
    std::string error;    // non-empty where the environment's value was rejected
};

// The table, in the order the README lists it.
const std::vector<SettingSpec>& setting_specs();

// Every setting with its current value (an invalid one carries its error instead of raising).
std::vector<SettingValue> settings_now();

// The current value of one setting, checked; MinferError if the environment gave an invalid one.
std::string setting_text(const char* name);
bool setting_bool(const char* name);
double setting_number(const char* name);

// "a|b|c" lists: whether v is one of them, and the list as "a, b, c" for messages (the settings' Choice values
// and the kernel choices share this form).
bool one_of(const char* allowed, const std::string& v);
std::string listed(const char* allowed);

// Sets a value for this process (checked as the environment's would be); an empty value restores
// the default.  MinferError for an unknown name or an invalid value.
void set_setting(const std::string& name, const std::string& value);

}  // namespace minfer
