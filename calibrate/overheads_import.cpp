#include "calibrate/overheads_import.hpp"

#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "calibrate/profile_writer.hpp"
#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "core/text.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {
namespace {

using core::InputError;
using core::ObjectReader;
using core::Range;
using nlohmann::json;

// The file measure_overheads.py writes (its GENERATED_BY and SCHEMA_VERSION).
constexpr const char* kGeneratedBy = "validation/measure_overheads.py";

// The flavours fitted per sharding unit and per parameter tensor; the keys are the same in the
// measurement's "flavours" and in the profile's "framework.flavours".
constexpr const char* kUnitTensorFlavours[] = {"ddp", "fsdp1", "fsdp2", "deepspeed_zero12"};
constexpr const char* kTimes[] = {"forward_unit_us", "backward_unit_us", "forward_tensor_us",
                                  "backward_tensor_us"};

// A flavour whose run failed carries "error" and no numbers.
bool measured(const json& flavours, const char* name) {
  return flavours.contains(name) && flavours[name].is_object() && !flavours[name].contains("error");
}

// What a measured time can be: from 0 up to the measuring run's own duration (`limit_us`).
Range measured_time(double limit_us) { return Range::between(0.0, limit_us); }

json unit_tensor_fit(const json& flavour, const std::string& pointer, double limit_us) {
  ObjectReader r(flavour, pointer);
  json out = json::object();
  for (const char* key : kTimes) out[key] = r.number(key, measured_time(limit_us));
  return out;
}

// DeepSpeed ZeRO-3 hooks every submodule: its fit with a term per Linear submodule
// (measure_overheads.py's fit_with_submodules: extra = step + unit*units + submodule*submodules
// + tensor*tensors), whose per-step constant the profile leaves out as for the other flavours.
json zero3_fit(const json& deepspeed, const std::string& pointer, double limit_us) {
  ObjectReader r(deepspeed, pointer);
  ObjectReader fit(r.object("fit_with_submodules"), pointer + "/fit_with_submodules");
  json out = json::object();
  for (const char* direction : {"forward", "backward"}) {
    const std::string at = fit.pointer_of(direction);
    ObjectReader d(fit.object(direction), at);
    ObjectReader c(d.object("coefficients_us"), at + "/coefficients_us");
    for (const char* term : {"unit", "submodule", "tensor"})
      out[fmt::format("{}_{}_us", direction, term)] = c.number(term, measured_time(limit_us));
  }
  return out;
}

std::string text_or(const json& object, const char* key, const char* otherwise) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : otherwise;
}

// "torch 2.15.0+cu132, deepspeed 0.19.8, python 3.11.7 on an AMD EPYC host"
std::string provenance(const json& m) {
  const json versions = m.value("versions", json::object());
  const json host = m.value("host", json::object());
  return fmt::format("torch {}, deepspeed {}, python {} on {}", text_or(versions, "torch", "?"),
                     text_or(versions, "deepspeed", "?"), text_or(versions, "python", "?"),
                     text_or(host, "cpu", "an unnamed CPU"));
}

void read_host_optimizer(const json& m, MeasuredOverheads& out) {
  ObjectReader r(m, "");
  const json* opt = r.optional_object("host_optimizer");
  if (opt == nullptr) return;
  ObjectReader o(*opt, "/host_optimizer");
  // DeepSpeed's CPUAdam steps ZeRO-Offload's fp32 partition; FSDP's CPUOffload steps
  // torch.optim.AdamW on CPU tensors, which picks foreach=False there.
  const std::pair<const char*, const char*> families[] = {{"deepspeed", "deepspeed_cpu_adam"},
                                                          {"torch", "torch_adamw_foreach_false"}};
  json rates = json::object();
  std::vector<std::string> said;
  for (const auto& [family, key] : families) {
    const std::string at = o.pointer_of(key);
    ObjectReader k(o.object(key), at);
    // AdamW reads 16 and writes 12 bytes per parameter: 500 Gparams/s would move 14 TB/s, ten
    // times the memory bandwidth of a two-socket host.
    const double rate = k.number("Gparams_per_s", Range{0.0, 500.0, true});
    const auto threads = k.optional_integer("threads", Range::positive());
    rates[family] = rate;
    said.push_back(fmt::format("{} {} Gparams/s{}", key, rate,
                               threads ? fmt::format(" on {} threads", *threads) : ""));
  }
  out.host_optimizer_Gparams_per_s = rates;
  out.host_optimizer_source = fmt::format("optimizer_Gparams_per_s measured by {} ({}): {}",
                                          kGeneratedBy, provenance(m), fmt::join(said, ", "));
}

}  // namespace

MeasuredOverheads overheads_from_measurement(const json& m) {
  if (!m.is_object())
    throw InputError("", "must be a JSON object written by " + std::string(kGeneratedBy));
  ObjectReader r(m, "");
  if (const auto by = r.string("generated_by"); by != kGeneratedBy)
    throw InputError("/generated_by", fmt::format("must be \"{}\", got \"{}\"", kGeneratedBy, by));
  if (const auto v = r.integer("schema_version"); v != 1)
    throw InputError("/schema_version", fmt::format("must be 1, got {}", v));

  // Every time is bounded by the run that measured it (its elapsed_s), or by an hour where the
  // file does not say.
  const double limit_us =
      1e6 * r.optional_number("elapsed_s", Range{0.0, 2.6e6, true}).value_or(3600.0);
  MeasuredOverheads out;
  json flavours_out = json::object();
  std::vector<std::string> names;
  if (const json* flavours = r.optional_object("flavours")) {
    for (const char* name : kUnitTensorFlavours) {
      if (!measured(*flavours, name)) continue;
      flavours_out[name] =
          unit_tensor_fit((*flavours)[name], fmt::format("/flavours/{}", name), limit_us);
      names.push_back(name);
    }
    if (measured(*flavours, "deepspeed")) {
      flavours_out["deepspeed_zero3"] =
          zero3_fit((*flavours)["deepspeed"], "/flavours/deepspeed", limit_us);
      names.push_back("deepspeed_zero3 (from deepspeed's fit_with_submodules)");
    }
  }
  out.framework = {
      {"op_dispatch_us", r.number("op_dispatch_autograd_us", measured_time(limit_us))},
      {"flavours", flavours_out},
      {"source",
       fmt::format("measured with the frameworks' own code by {} ({}): op_dispatch_us is its "
                   "op_dispatch_autograd_us; flavours {} are its fits per unit and per parameter "
                   "tensor (per submodule too for deepspeed_zero3), the per-step constants left "
                   "out",
                   kGeneratedBy, provenance(m),
                   names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")))}};
  read_host_optimizer(m, out);
  return out;
}

json merge_overheads(const json& profile, const MeasuredOverheads& measured) {
  json merged = profile;
  json framework = measured.framework;
  // Flavours the measurement lacks keep the profile's values, and the source says so.
  std::vector<std::string> kept;
  if (profile.contains("framework") && profile["framework"].contains("flavours"))
    for (const auto& [name, value] : profile["framework"]["flavours"].items())
      if (!framework["flavours"].contains(name)) {
        framework["flavours"][name] = value;
        kept.push_back(name);
      }
  if (!kept.empty())
    framework["source"] =
        fmt::format("{}; {} kept from the profile as it was",
                    framework["source"].get<std::string>(), fmt::join(kept, ", "));
  merged["framework"] = framework;
  if (measured.host_optimizer_Gparams_per_s) {
    merged["host"]["optimizer_Gparams_per_s"] = *measured.host_optimizer_Gparams_per_s;
    const std::string before = profile["host"].value("source", "");
    merged["host"]["source"] = before.empty()
                                   ? measured.host_optimizer_source
                                   : before + "; replaced: " + measured.host_optimizer_source;
  }
  return merged;
}

int run_import_overheads(const OverheadsImportOptions& options, std::ostream& out) {
  const std::string into = into_profile_path(options.into);  // a profile's name, or a path
  const std::string target = merge_destination(into, options.out);
  core::check_destination(target, options.out.empty() ? "--into" : "--out");
  const json profile = read_profile_for_merge(into);
  const MeasuredOverheads measured =
      core::read_json_document(options.measurement, overheads_from_measurement);
  const json merged = merge_overheads(profile, measured);
  try {  // what the profile's reader refuses came from the measurement: its file is named
    documents::hardware_from_json(merged, std::filesystem::path(target).stem().string());
  } catch (const core::InputError& e) {
    throw core::InputError(core::printable(options.measurement),
                           fmt::format("merged into {}: {}", into, e.what()));
  }
  core::write_file(target, core::json_text(merged, 2) + "\n",
                   options.out.empty() ? "--into" : "--out");
  const auto& flavours = measured.framework["flavours"];
  fmt::print(out, "# op dispatch {} us; {} flavour(s) measured",
             measured.framework["op_dispatch_us"].get<double>(), flavours.size());
  for (const auto& [name, fit] : flavours.items()) {
    fmt::print(out, "\n#   {:<16}", name);
    for (const char* direction : {"forward", "backward"}) {
      fmt::print(out, " {} {:.3f} us/unit {:.3f} us/tensor", direction,
                 fit[fmt::format("{}_unit_us", direction)].get<double>(),
                 fit[fmt::format("{}_tensor_us", direction)].get<double>());
      if (const auto key = fmt::format("{}_submodule_us", direction); fit.contains(key))
        fmt::print(out, " {:.3f} us/submodule", fit[key].get<double>());
    }
  }
  if (measured.host_optimizer_Gparams_per_s)
    fmt::print(out, "\n# host optimizer: DeepSpeed CPUAdam {} Gparams/s, torch AdamW {} Gparams/s",
               (*measured.host_optimizer_Gparams_per_s)["deepspeed"].get<double>(),
               (*measured.host_optimizer_Gparams_per_s)["torch"].get<double>());
  fmt::print(out, "\n# wrote {} (framework overheads of {} merged into {})\n", target,
             options.measurement, into);
  return 0;
}

}  // namespace shardplan::calibrate
