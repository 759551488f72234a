// Writing what calibrate measured as hardware profile JSON (hardware_profiles/*.json, read by
// documents::hardware_from_json): the "calibration" section (fitted curves with their samples and
// errors, GEMMs, compute efficiency, memory bandwidth, element-wise rate, attention cores,
// when/where/with what), a complete profile for a system measured from scratch, or the section
// merged into an existing profile. The commands write them with core::write_file (whole or not at
// all).
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/fit.hpp"
#include "calibrate/gemm_shapes.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {

struct FittedCurve {
  documents::Collective op = documents::Collective::all_reduce;
  int ranks = 0;
  documents::Tier tier = documents::Tier::intra_node;
  CurveFit fit;
  FitOptions goal;  // the errors the fit was asked to reach (written beside its errors)
};

struct CalibrationRecord {
  std::string date;     // ISO 8601
  std::string backend;  // "mpi" or "nccl"
  std::string host;     // hosts measured, comma-separated
  std::string library;  // "Open MPI v4.1.4", "NCCL 2.21.5"
  int ranks = 0;
  std::vector<FittedCurve> curves;
  std::vector<GemmMeasurement> gemm;
  std::optional<double> compute_efficiency;           // model-shape GEMM rate / peak
  std::optional<double> memory_bandwidth_Bps;         // device copy bandwidth
  std::optional<double> elementwise_elems_per_s;      // documents/workload.hpp passes per second
  std::vector<documents::AttentionSample> attention;  // the model's attention cores, as run
  std::optional<documents::StragglerWait> straggler_wait;  // two or more ranks
  nlohmann::json extra = nlohmann::json::object();
};

nlohmann::json calibration_to_json(const CalibrationRecord& record);

// Link figures of a tier in the profile's terms, from its fitted curves: bandwidth = the
// bandwidth-bound piece's rate as bus bandwidth (nccl-tests' busbw: per-rank link rate of a ring);
// latency = the smallest-size piece's latency per ring step (2(n−1) steps for all-reduce, n−1 for
// the others). Prefers all_reduce, then the largest group.
struct LinkEstimate {
  double bandwidth_Bps = 0;
  double latency_s = 0;
  documents::Collective op = documents::Collective::all_reduce;
  int ranks = 0;
};
std::optional<LinkEstimate> link_from_curves(const std::vector<FittedCurve>& curves,
                                             documents::Tier tier);

// What a profile written from scratch says about the device, node and host.
struct MeasuredSystem {
  std::string name;        // profile name (the file stem)
  std::string device;      // "NVIDIA H100 80GB HBM3", or the CPU model for a CPU device
  bool cpu_device = true;  // each rank is a CPU device (MPI backend)
  double device_memory_bytes = 0;
  std::string device_memory_note;                 // how it was found
  std::map<documents::DType, double> peak_flops;  // best measured GEMM rate per dtype
  documents::DType efficiency_dtype = documents::DType::fp32;
  double compute_efficiency = 0;
  double memory_bandwidth_Bps = 0;
  int ranks_per_node = 1;
  double host_memory_bytes = 0;
  double host_link_Bps = 0;
  std::string host_link_note;
  double optimizer_params_per_s = 0;  // per node
};

// A complete profile (schema_version 1) with `record` as its calibration section; every "source"
// says what was measured, when, and what is a stand-in.
nlohmann::json measured_profile(const MeasuredSystem& system, const CalibrationRecord& record);

// `profile` with `calibration` merged into its calibration section: curves replace those with the
// same op, ranks and tier and keep the others; GEMMs, compute efficiency, memory bandwidth, the
// element-wise rate and the attention cores are replaced when the new section has them; date,
// backend, host, library and ranks are the new section's; extra keys are updated.
nlohmann::json merge_calibration(const nlohmann::json& profile, const nlohmann::json& calibration);

// --into's file: a path as given when a file is there, else a profile's name (a stem under the data
// dir's hardware_profiles/, as planner --hardware takes it) resolved to that file. A bare name that
// is neither throws InputError("--into", ...) naming the profiles; a path is returned as given, so
// that reading it says what is wrong with it.
std::string into_profile_path(const std::string& name_or_path);

// Whether `path` is one of the profiles shipped with the program (a file of the data dir's
// hardware_profiles/, by any path that leads there): those are read-only.
bool is_shipped_profile(const std::string& path);
// Where a merge into `into_path` is written: `out` when given, else the profile in place, which a
// shipped profile refuses (InputError on --into, naming it and asking for --out).
std::string merge_destination(const std::string& into_path, const std::string& out);

// Reads the profile named by --into and checks it with the cost model's parser; errors name the
// flag and the file.
nlohmann::json read_profile_for_merge(const std::string& path);

// x rounded to `digits` significant digits, for readable documents.
// The curves whose fit misses the errors it was asked to reach (a loaded host, too few repeats),
// named with their errors and goals in one line; "" when every fit meets its goal. calibrate
// writes no profile with such a curve unless --accept-poor-fit (and the planner then says so).
std::string poor_fits(const CalibrationRecord& r);
// Says on `notes` which fits miss their goal; false (write nothing) unless `accept`.
bool allow_poor_fits(const CalibrationRecord& r, bool accept, std::ostream& notes);

double rounded(double x, int digits = 5);

}  // namespace shardplan::calibrate
