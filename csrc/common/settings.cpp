#include "common/settings.h"

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cctype>
#include <mutex>

#include "common/error.h"

namespace minfer {

namespace {

const std::vector<SettingSpec> kSpecs = {
    {"MINFER_DEVICE", SettingType::Choice, "auto|cpu|cuda|metal", "auto",
     "the device a session runs on when it names none (auto: Metal, then CUDA, then the CPU)", false},
    {"MINFER_CACHE", SettingType::Text, "a directory", "",
     "where downloaded models are kept (empty: ~/.cache/minfer)", false},
    {"MINFER_OFFLINE", SettingType::Bool, "0|1", "0", "1 forbids downloads: only cached models are used", false},
    {"MINFER_CPU_ISA", SettingType::Choice, "auto|scalar|avx2|avx512|neon", "auto",
     "the CPU kernels' instruction set (auto: the best this CPU runs)", false},
    {"MINFER_HUGEPAGES", SettingType::Bool, "0|1", "0",
     "1 copies the weights into memory backed by 2 MB pages instead of mapping the file (faster CPU decode, "
     "a second copy in memory)", false},
    {"MINFER_GPU_TIMEOUT_S", SettingType::Number, "seconds > 0", "10",
     "the longest any wait for the GPU (CUDA or Metal) may take before it is an error", false},
    {"MINFER_METALLIB", SettingType::Text, "a file", "",
     "the Metal kernel library (empty: minfer.metallib next to the extension)", false},
    {"MINFER_CUDA_GRAPHS", SettingType::Bool, "0|1", "1",
     "0 launches CUDA kernels one by one instead of replaying captured graphs", true},
    {"MINFER_CPU_OPS", SettingType::OpList, "op names, e.g. Rope,Add", "",
     "ops a GPU backend leaves to the CPU (mixed graphs)", true},
    {"MINFER_OP_PROFILE", SettingType::Bool, "0|1", "0", "1 prints seconds per op kind when a session ends", true},
    {"MINFER_GRAPH_TRACE", SettingType::Bool, "0|1", "0",
     "1 prints each new plan's splits and its op x backend census", true},
};

struct State {
    std::string text, source, error;
};

std::mutex mu;
std::vector<State> states;  // parallel to kSpecs, filled on first use

const SettingSpec* find_spec(const std::string& name, size_t* index) {
    for (size_t i = 0; i < kSpecs.size(); i++)
        if (name == kSpecs[i].name) {
            if (index) *index = i;
            return &kSpecs[i];
        }
    return nullptr;
}

// Why `v` is not a valid value of `s` ("" where it is).
std::string invalid(const SettingSpec& s, const std::string& v) {
    const std::string head = strfmt("%s='%s': ", s.name, v.c_str());
    switch (s.type) {
        case SettingType::Bool:
            return v == "0" || v == "1" ? "" : head + "must be 0 or 1";
        case SettingType::Number: {
            char* end = nullptr;
            const double d = std::strtod(v.c_str(), &end);
            return !v.empty() && end && !*end && d > 0 ? "" : head + "must be a positive number of seconds";
        }
        case SettingType::Choice:
            return one_of(s.allowed, v) ? "" : head + "must be one of " + listed(s.allowed);
        case SettingType::OpList:
            for (char c : v)
                if (!(std::isalnum((unsigned char)c) || c == ',')) return head + "must be op names separated by commas";
            return "";
        case SettingType::Text:
            return "";
    }
    return "";
}

void load_locked() {
    if (!states.empty()) return;
    states.resize(kSpecs.size());
    for (size_t i = 0; i < kSpecs.size(); i++) {
        const SettingSpec& s = kSpecs[i];
        State& st = states[i];
        const char* env = std::getenv(s.name);
        if (env && *env) {
            st.text = env;
            st.source = "environment";
            st.error = invalid(s, st.text);
        } else {
            st.text = s.fallback;
            st.source = "default";
        }
    }
}

State get(const char* name) {
    size_t i = 0;
    if (!find_spec(name, &i)) throw MinferError(strfmt("no setting named %s", name));
    std::lock_guard<std::mutex> lock(mu);
    load_locked();
    return states[i];
}

}  // namespace

bool one_of(const char* allowed, const std::string& v) {
    const std::string a = allowed;
    for (size_t at = 0; at <= a.size();) {
        const size_t end = std::min(a.find('|', at), a.size());
        if (end - at == v.size() && a.compare(at, end - at, v) == 0) return true;
        at = end + 1;
    }
    return false;
}

std::string listed(const char* allowed) {
    std::string list;
    for (const char* c = allowed; *c; c++) list += *c == '|' ? std::string(", ") : std::string(1, *c);
    return list;
}

const std::vector<SettingSpec>& setting_specs() { return kSpecs; }

std::vector<SettingValue> settings_now() {
    std::lock_guard<std::mutex> lock(mu);
    load_locked();
    std::vector<SettingValue> out;
    for (size_t i = 0; i < kSpecs.size(); i++)
        out.push_back({&kSpecs[i], states[i].text, states[i].source, states[i].error});
    return out;
}

std::string setting_text(const char* name) {
    State st = get(name);
    if (!st.error.empty()) throw MinferError(st.error);
    return st.text;
}

bool setting_bool(const char* name) { return setting_text(name) == "1"; }

double setting_number(const char* name) { return std::strtod(setting_text(name).c_str(), nullptr); }

void set_setting(const std::string& name, const std::string& value) {
    size_t i = 0;
    const SettingSpec* s = find_spec(name, &i);
    if (!s) {
        std::string names;
        for (const SettingSpec& k : kSpecs) names += std::string(names.empty() ? "" : ", ") + k.name;
        throw MinferError(strfmt("no setting named %s (the settings: %s)", name.c_str(), names.c_str()));
    }
    const std::string v = value.empty() ? std::string(s->fallback) : value;
    const std::string why = invalid(*s, v);
    if (!why.empty()) throw MinferError(why);
    std::lock_guard<std::mutex> lock(mu);
    load_locked();
    states[i] = State{v, value.empty() ? "default" : "set", ""};
}

}  // namespace minfer
