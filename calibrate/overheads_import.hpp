// `calibrate import-overheads FILE --into PROFILE`: a framework's host-side costs (hooks, flat
// buffer copies, op dispatch, the host optimizer's rate) as measured on the user's own host by
// validation/measure_overheads.py, which runs torch, FSDP1/FSDP2 and DeepSpeed's own code there.
// This C++ program cannot run those frameworks, so the measurement is a Python script and its
// output is imported here, as nccl-tests logs are by import-nccl-tests.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace shardplan::calibrate {

struct OverheadsImportOptions {
  std::string measurement;  // measure_overheads.py's --out file
  std::string into;         // profile (path) the overheads replace theirs in
  std::string out;          // file to write ("" = --into in place)
};

// What the measurement gives, in the profile's own keys: the profile's "framework" section
// ({op_dispatch_us, flavours: {ddp, fsdp1, fsdp2, deepspeed_zero12, deepspeed_zero3}, source}),
// and the host optimizer's rates per family ({"deepspeed": Gparams/s, "torch": Gparams/s}) with
// their provenance when the file measured them. A flavour the file does not have (or whose run
// failed: it then carries "error") is left out. Throws core::InputError naming the JSON
// pointer and the value for a file that is not measure_overheads.py's, or a negative fit.
// clang-tidy 14 says its (noexcept) default constructor may throw: it follows nlohmann::json's
// noexcept default constructor into json_value(value_t), to a throw that null never reaches
// (llvm/llvm-project#54956: the analysis does not stop at noexcept).
struct MeasuredOverheads {  // NOLINT(bugprone-exception-escape)
  nlohmann::json framework;
  std::optional<nlohmann::json> host_optimizer_Gparams_per_s;
  std::string host_optimizer_source;
};
MeasuredOverheads overheads_from_measurement(const nlohmann::json& measurement);

// The profile with its framework section replaced by the measured one (flavours the file lacks
// keep the profile's values) and, where measured, its host optimizer rates.
nlohmann::json merge_overheads(const nlohmann::json& profile, const MeasuredOverheads& measured);

// Returns the exit code; throws core::InputError for a bad file, profile or flag.
int run_import_overheads(const OverheadsImportOptions& options, std::ostream& out);

}  // namespace shardplan::calibrate
