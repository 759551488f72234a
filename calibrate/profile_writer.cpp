#include "calibrate/profile_writer.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "core/version.hpp"
#include "documents/hardware.hpp"
#include "documents/model.hpp"

namespace shardplan::calibrate {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;  // 2^30
constexpr double kGB = 1e9;

using nlohmann::json;

json curve_to_json(const FittedCurve& c) {
  json segments = json::array(), samples = json::array();
  for (const auto& s : c.fit.segments)
    segments.push_back({{"min_bytes", s.min_bytes},
                        {"max_bytes", s.max_bytes},
                        {"latency_us", rounded(s.latency_s * 1e6)},
                        {"bandwidth_GBps", rounded(s.bandwidth_Bps / kGB)}});
  for (const auto& m : c.fit.samples)
    samples.push_back({{"size_bytes", m.size_bytes}, {"time_us", rounded(m.time_s * 1e6, 6)}});
  return {{"op", documents::traits(c.op).name},
          {"ranks", c.ranks},
          {"tier", documents::tier_name(c.tier)},
          {"segments", segments},
          {"samples", samples},
          {"fit_error",
           {{"median_rel", rounded(c.fit.median_rel_error, 3)},
            {"max_rel", rounded(c.fit.max_rel_error, 3)},
            {"goal_median_rel", c.goal.median_goal},
            {"goal_max_rel", c.goal.max_goal}}}};
}

bool same_curve(const json& a, const json& b) {
  return a.value("op", "") == b.value("op", "") && a.value("ranks", 0) == b.value("ranks", 0) &&
         a.value("tier", "") == b.value("tier", "");
}

std::string measured_note(const CalibrationRecord& r) {
  return fmt::format("measured by calibrate on {} ({} backend, {} ranks on {})", r.date, r.backend,
                     r.ranks, r.host);
}

}  // namespace

std::string poor_fits(const CalibrationRecord& r) {
  std::vector<std::string> missed;
  for (const auto& c : r.curves)
    if (!c.fit.meets(c.goal))
      missed.push_back(fmt::format(
          "{} over {} ranks ({}): median {:.1f}%, max {:.1f}% against {:.0f}% and {:.0f}%",
          documents::traits(c.op).name, c.ranks, documents::tier_name(c.tier),
          100 * c.fit.median_rel_error, 100 * c.fit.max_rel_error, 100 * c.goal.median_goal,
          100 * c.goal.max_goal));
  return missed.empty() ? "" : fmt::format("{}", fmt::join(missed, "; "));
}

bool allow_poor_fits(const CalibrationRecord& r, bool accept, std::ostream& notes) {
  const auto poor = poor_fits(r);
  if (poor.empty()) return true;
  if (accept)
    fmt::print(notes, "calibrate: --accept-poor-fit: writing fits that miss their goal ({})\n",
               poor);
  else
    fmt::print(notes,
               "calibrate: fits miss their goal ({}): nothing is written (measure on an idle host "
               "or with more --iters, or give --accept-poor-fit to write them)\n",
               poor);
  return accept;
}

double rounded(double x, int digits) {
  if (x == 0 || !std::isfinite(x)) return x;
  const double scale =
      std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(std::fabs(x)))));
  return std::round(x * scale) / scale;
}

json calibration_to_json(const CalibrationRecord& r) {
  json doc = {{"date", r.date},
              {"backend", r.backend},
              {"host", r.host},
              {"library", r.library},
              {"ranks", r.ranks}};
  json curves = json::array();
  for (const auto& c : r.curves) curves.push_back(curve_to_json(c));
  doc["collectives"] = curves;
  if (!r.gemm.empty()) {
    json gemm = json::array();
    for (const auto& g : r.gemm)
      gemm.push_back({{"m", g.shape.m},
                      {"n", g.shape.n},
                      {"k", g.shape.k},
                      {"dtype", documents::dtype_name(g.dtype)},
                      {"time_us", rounded(g.time_s * 1e6)},
                      {"TFLOPs", rounded(g.flops_per_s() / 1e12, 4)}});
    doc["gemm"] = gemm;
  }
  if (r.compute_efficiency) doc["compute_efficiency"] = rounded(*r.compute_efficiency, 3);
  if (r.memory_bandwidth_Bps)
    doc["memory_bandwidth_GBps"] = rounded(*r.memory_bandwidth_Bps / kGB, 4);
  if (r.elementwise_elems_per_s)
    doc["elementwise_Gelems_per_s"] = rounded(*r.elementwise_elems_per_s / 1e9, 4);
  if (r.straggler_wait)
    doc["straggler_wait"] = {{"fraction", rounded(r.straggler_wait->fraction, 4)},
                             {"ranks", r.straggler_wait->ranks},
                             {"segment_us", rounded(r.straggler_wait->segment_s * 1e6)},
                             {"repetitions", r.straggler_wait->repetitions}};
  if (!r.attention.empty()) {
    json attention = json::array();
    for (const auto& a : r.attention)
      attention.push_back({{"impl", a.impl},
                           {"dtype", documents::dtype_name(a.dtype)},
                           {"batch", a.batch},
                           {"seq", a.seq},
                           {"heads", a.heads},
                           {"kv_heads", a.kv_heads},
                           {"head_dim", a.head_dim},
                           {"forward_us", rounded(a.forward_s * 1e6)},
                           {"backward_us", rounded(a.backward_s * 1e6)}});
    doc["attention"] = attention;
  }
  doc["extra"] = r.extra.is_object() ? r.extra : json::object();
  return doc;
}

std::optional<LinkEstimate> link_from_curves(const std::vector<FittedCurve>& curves,
                                             documents::Tier tier) {
  const FittedCurve* best = nullptr;
  for (const auto& c : curves) {
    if (c.tier != tier || c.ranks < 2 || c.fit.segments.empty()) continue;
    auto rank = [](const FittedCurve& x) {
      return std::pair(x.op == documents::Collective::all_reduce, x.ranks);
    };
    if (best == nullptr || rank(c) > rank(*best)) best = &c;
  }
  if (best == nullptr) return std::nullopt;
  const int n = best->ranks;
  const double steps =
      best->op == documents::Collective::all_reduce ? 2.0 * (n - 1) : static_cast<double>(n - 1);
  LinkEstimate link;
  link.op = best->op;
  link.ranks = n;
  link.bandwidth_Bps =
      best->fit.segments.back().bandwidth_Bps * documents::traits(best->op).bus_factor(n);
  link.latency_s = best->fit.segments.front().latency_s / steps;
  return link;
}

namespace {

// A link's section: the fitted curve of its tier, else the other tier's, else half the memory
// copy bandwidth.
json link_json(const MeasuredSystem& s, const std::string& measured, documents::Tier tier,
               const std::optional<LinkEstimate>& own, const std::optional<LinkEstimate>& other) {
  const bool intra = tier == documents::Tier::intra_node;
  // A fitted curve's bus bandwidth is each rank's: per GPU (documents/hardware.hpp reads the
  // inter-node key with its unit).
  const char* bandwidth_key = intra ? "bandwidth_GBps" : "bandwidth_GBps_per_gpu";
  const std::string link = s.cpu_device
                               ? (intra ? "MPI within a node (shared memory)" : "MPI between nodes")
                               : (intra ? "NCCL within a node" : "NCCL between nodes");
  if (own)
    return {
        {"link", link},
        {bandwidth_key, rounded(own->bandwidth_Bps / kGB, 4)},
        {"latency_us", rounded(own->latency_s * 1e6, 4)},
        {"source",
         fmt::format("{}: the fitted {} curve on {} ranks: bus bandwidth of its bandwidth-bound "
                     "piece, and its smallest-size latency per ring step",
                     measured, documents::traits(own->op).name, own->ranks)}};
  if (other)
    return {
        {"link", link},
        {bandwidth_key, rounded(other->bandwidth_Bps / kGB, 4)},
        {"latency_us", rounded(other->latency_s * 1e6, 4)},
        {"source",
         fmt::format("{}: NOT MEASURED (no {} group in this run): the {} values stand in", measured,
                     documents::tier_name(tier), intra ? "inter-node" : "intra-node")}};
  return {{"link", link},
          {bandwidth_key, rounded(s.memory_bandwidth_Bps / 2 / kGB, 4)},
          {"latency_us", 0},
          {"source",
           fmt::format("{}: NOT MEASURED (no group of two or more ranks): half the memory copy "
                       "bandwidth (one direction of a copy) and no latency stand in",
                       measured)}};
}

json gpu_json(const MeasuredSystem& s, const std::string& measured) {
  json peak = json::object();
  for (const auto& [dtype, flops] : s.peak_flops)
    peak[documents::dtype_name(dtype)] = rounded(flops / 1e12, 4);
  return {
      {"name", s.device},
      // A CPU rank's collectives block its computing thread: the cost model serialises
      // them with compute (documents/hardware.hpp).
      {"kind", s.cpu_device ? "cpu" : "gpu"},
      {"memory_GiB", rounded(s.device_memory_bytes / kGiB, 4)},
      {"peak_TFLOPs", peak},
      {"memory_bandwidth_GBps", rounded(s.memory_bandwidth_Bps / kGB, 4)},
      {"compute_efficiency", rounded(s.compute_efficiency, 3)},
      {"source",
       fmt::format("{}: memory: {}; peak: the best measured GEMM rate per type; memory bandwidth: "
                   "copy, read + write bytes; compute_efficiency: the model-shape {} GEMM rate / "
                   "that peak",
                   measured, s.device_memory_note, documents::dtype_name(s.efficiency_dtype))}};
}

json host_json(const MeasuredSystem& s, const std::string& measured) {
  return {
      {"memory_GiB", rounded(s.host_memory_bytes / kGiB, 4)},
      {"link_bandwidth_GBps", rounded(s.host_link_Bps / kGB, 4)},
      {"optimizer_Gparams_per_s", rounded(s.optimizer_params_per_s / 1e9, 4)},
      {"source",
       fmt::format("{}: memory: MemTotal of /proc/meminfo; link: {}; optimizer: a fused fp32 Adam "
                   "step per rank times the ranks of a node",
                   measured, s.host_link_note)}};
}

json overhead_json(const MeasuredSystem& s) {
  return {{"cuda_context_GiB", s.cpu_device ? 0.0 : 0.5},
          {"nccl_workspace_GiB", s.cpu_device ? 0.0 : 0.5},
          {"fragmentation", s.cpu_device ? 0.0 : 0.05},
          {"source",
           s.cpu_device
               ? "a CPU rank has no CUDA context or NCCL buffers, and the executor's tracked "
                 "allocator allocates exactly what it is asked for (no caching pool, no "
                 "fragmentation)"
               : "NOT MEASURED: planning defaults (CUDA context with cuBLAS ~0.5 GiB, NCCL "
                 "buffers ~0.5 GiB, fragmentation 5%), replaced by the executor's measurement"}};
}

}  // namespace

json measured_profile(const MeasuredSystem& s, const CalibrationRecord& r) {
  const std::string measured = measured_note(r);
  const auto intra = link_from_curves(r.curves, documents::Tier::intra_node);
  const auto inter = link_from_curves(r.curves, documents::Tier::inter_node);
  const std::string device_kind = s.cpu_device ? "CPU rank" : "GPU";

  return {{"schema_version", 1},
          {"generator", core::generator()},
          {"name", s.name},
          {"description", fmt::format("{} ({} per rank, {} per node), {}", s.device, device_kind,
                                      s.ranks_per_node, measured)},
          {"gpu", gpu_json(s, measured)},
          {"node",
           {{"gpus_per_node", s.ranks_per_node},
            {"source", fmt::format("{}: ranks per node of the run", measured)}}},
          {"intra_node", link_json(s, measured, documents::Tier::intra_node, intra, inter)},
          {"inter_node", link_json(s, measured, documents::Tier::inter_node, inter, intra)},
          {"host", host_json(s, measured)},
          {"overhead", overhead_json(s)},
          {"calibration", calibration_to_json(r)}};
}

json merge_calibration(const json& profile, const json& calibration) {
  json merged = profile;
  merged["generator"] = core::generator();  // the profile as calibrate writes it now
  if (!merged.contains("calibration") || !merged["calibration"].is_object()) {
    merged["calibration"] = calibration;
    return merged;
  }
  json& old = merged["calibration"];
  json curves = old.contains("collectives") && old["collectives"].is_array() ? old["collectives"]
                                                                             : json::array();
  for (const auto& c : calibration.value("collectives", json::array())) {
    const auto same =
        std::find_if(curves.begin(), curves.end(), [&](const json& x) { return same_curve(x, c); });
    if (same != curves.end())
      *same = c;
    else
      curves.push_back(c);
  }
  json extra = old.contains("extra") && old["extra"].is_object() ? old["extra"] : json::object();
  extra.update(calibration.value("extra", json::object()));
  for (const char* key : {"gemm", "compute_efficiency", "memory_bandwidth_GBps",
                          "elementwise_Gelems_per_s", "attention"})
    if (calibration.contains(key)) old[key] = calibration[key];
  for (const char* key : {"date", "backend", "host", "library", "ranks"})
    old[key] = calibration.at(key);
  old["collectives"] = curves;
  old["extra"] = extra;
  return merged;
}

std::string into_profile_path(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path given(name_or_path);
  const bool bare_name = given.extension() != ".json" && !given.has_parent_path();
  if (fs::exists(given, ec) || !bare_name) return name_or_path;
  const fs::path preset =
      fs::path(documents::data_dir()) / "hardware_profiles" / (name_or_path + ".json");
  if (!fs::is_regular_file(preset, ec))
    throw core::InputError(
        "--into", fmt::format("\"{}\" is neither a file nor a profile in {}/hardware_profiles "
                              "(profiles: {})",
                              name_or_path, documents::data_dir(),
                              fmt::join(documents::preset_hardware_names(), ", ")));
  return preset.string();
}

bool is_shipped_profile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path shipped =
      fs::weakly_canonical(fs::path(documents::data_dir()) / "hardware_profiles", ec);
  if (ec) return false;
  const fs::path file = fs::weakly_canonical(path, ec);
  return !ec && file.parent_path() == shipped;
}

std::string merge_destination(const std::string& into_path, const std::string& out) {
  if (!out.empty()) return out;
  if (is_shipped_profile(into_path))
    throw core::InputError(
        "--into", fmt::format("{} is a profile shipped with the program, read-only: write the "
                              "merged profile to a file of yours with --out FILE",
                              into_path));
  return into_path;
}

json read_profile_for_merge(const std::string& path) {
  try {
    return core::read_json_document(path, [&](const json& profile) {
      documents::hardware_from_json(profile, std::filesystem::path(path).stem().string());
      return profile;
    });
  } catch (const core::InputError& e) {
    // "--into: p.json: cannot open file: ...", or "--into: p.json: /gpu/memory_GiB: must be > 0"
    throw core::InputError("--into", e.what());
  }
}

}  // namespace shardplan::calibrate
