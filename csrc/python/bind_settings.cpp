// The settings table and the kernel-choice test hook, from Python: minfer.settings(),
// minfer.set_setting(name, value) and minfer.engine.force_kernel(choice, value).
#include "backends/kernel_choice.h"
#include "backends/offload.h"
#include "common/error.h"
#include "common/settings.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace minfer {

namespace {

const char* type_name(SettingType t) {
    switch (t) {
        case SettingType::Bool: return "bool";
        case SettingType::Number: return "number";
        case SettingType::Choice: return "choice";
        case SettingType::Text: return "text";
        case SettingType::OpList: return "ops";
    }
    return "?";
}

}  // namespace

void bind_settings(py::module_& m) {
    m.def("settings", [] {
        py::list out;
        for (const SettingValue& v : settings_now()) {
            py::dict d;
            d["name"] = v.spec->name;
            d["value"] = v.text;
            d["default"] = v.spec->fallback;
            d["type"] = type_name(v.spec->type);
            d["allowed"] = v.spec->allowed;
            d["meaning"] = v.spec->meaning;
            d["diagnostic"] = v.spec->diagnostic;
            d["source"] = v.source;
            d["error"] = v.error;
            out.append(d);
        }
        return out;
    }, "every MINFER_* setting: name, value, default, type, allowed, meaning, diagnostic, source, error");

    m.def("setting", [](const std::string& name) { return setting_text(name.c_str()); }, py::arg("name"),
          "the current value of one setting, checked (MinferError for an invalid environment value)");

    m.def("set_setting", [](const std::string& name, const std::string& value) {
        const std::string before = setting_text(name.c_str());
        set_setting(name, value);
        if (name == "MINFER_CPU_OPS") {
            try {
                cpu_ops_setting();  // op names are checked where ops are known
            } catch (...) {
                set_setting(name, before);
                throw;
            }
        }
    }, py::arg("name"), py::arg("value"),
       "sets a setting for this process, checked as the environment's value would be; '' restores the default");

    m.def("kernel_choices", [] {
        py::list out;
        for (const KernelChoiceSpec& c : kernel_choices()) {
            py::dict d;
            d["name"] = c.name;
            d["allowed"] = c.allowed;
            d["meaning"] = c.meaning;
            d["forced"] = forced_kernel(c.name);
            out.append(d);
        }
        return out;
    }, "the kernel choices tests may force: name, allowed values, meaning, the forced value ('' where the rule decides)");

    m.def("force_kernel", &force_kernel, py::arg("choice"), py::arg("value"),
          "forces a kernel choice (a test hook; 'auto' gives it back to the dispatch rule)");
}

}  // namespace minfer
