#include "calibrate/import_command.hpp"

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "calibrate/host_info.hpp"
#include "calibrate/nccl_tests_log.hpp"
#include "calibrate/profile_writer.hpp"
#include "calibrate/results_table.hpp"
#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/text.hpp"
#include "core/version.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {
namespace {

using core::InputError;

struct CurveKey {
  documents::Collective op;
  int ranks;
  documents::Tier tier;
  // NOLINTNEXTLINE(modernize-use-nullptr): the 0 is the language's own (llvm-project#53961)
  auto operator<=>(const CurveKey&) const = default;
};

CurveKey key_of(const NcclTestsLog& log, const ImportOptions& options) {
  CurveKey key{};
  if (options.op && log.op && *options.op != *log.op)
    throw InputError("--op",
                     fmt::format("{} but {} is a {} log", documents::traits(*options.op).name,
                                 log.path, documents::traits(*log.op).nccl_tests));
  const auto op = options.op ? options.op : log.op;
  if (!op)
    throw InputError(
        log.path, "names no nccl-tests binary (all_reduce_perf, ...) in its header or file name; "
                  "give --op");
  key.op = *op;
  if (options.ranks && log.ranks > 0 && *options.ranks != log.ranks)
    throw InputError("--ranks",
                     fmt::format("{} but {} lists {} ranks", *options.ranks, log.path, log.ranks));
  key.ranks = options.ranks ? *options.ranks : log.ranks;
  if (key.ranks < 1) throw InputError(log.path, "has no \"#  Rank\" lines; give --ranks");
  const std::optional<documents::Tier> found =
      log.hosts.empty() ? std::nullopt
                        : std::optional(log.hosts.size() > 1 ? documents::Tier::inter_node
                                                             : documents::Tier::intra_node);
  if (options.tier && found && *options.tier != *found)
    throw InputError("--tier",
                     fmt::format("{} but {} ran on {} host{}", documents::tier_name(*options.tier),
                                 log.path, log.hosts.size(), log.hosts.size() == 1 ? "" : "s"));
  const auto tier = options.tier ? options.tier : found;
  if (!tier) throw InputError(log.path, "has no hosts in \"#  Rank\" lines; give --tier");
  key.tier = *tier;
  return key;
}

// A log's curves describe the GPUs its rank lines name: merged into a profile of another GPU they
// would be that GPU's curves. Refused unless --force, which the notes then say.
void check_same_gpu(const std::vector<NcclTestsLog>& logs, const nlohmann::json& profile,
                    const ImportOptions& options, std::ostream& notes) {
  const std::string gpu = profile.value("gpu", nlohmann::json::object()).value("name", "");
  for (const auto& log : logs)
    for (const auto& device : log.devices) {
      if (device == gpu) continue;
      const std::string what = fmt::format("{} ran on {}, {} describes {}", log.path, device,
                                           options.into, gpu.empty() ? "no named GPU" : gpu);
      if (!options.force)
        throw core::InputError("--into", what + "; give --force to merge it anyway");
      fmt::print(notes, "# --force: {}; merged anyway\n", what);
    }
}

}  // namespace

namespace {

void add_once(std::vector<std::string>& list, const std::string& item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

}  // namespace

int run_import(const ImportOptions& given, std::ostream& out, std::ostream& notes) {
  ImportOptions options = given;
  // `-o -`: the document on standard output, as without --out and --into.
  const bool to_stdout = options.out == "-";
  if (to_stdout) options.out.clear();
  if (!options.into.empty())
    options.into = into_profile_path(options.into);  // a profile's name, or a path
  if (!options.out.empty())
    core::check_destination(options.out, "--out");
  else if (!options.into.empty() && !to_stdout)
    core::check_destination(merge_destination(options.into, ""), "--into");
  const nlohmann::json profile =
      options.into.empty() ? nlohmann::json() : read_profile_for_merge(options.into);
  std::vector<NcclTestsLog> logs;
  for (const auto& path : options.logs) logs.push_back(read_nccl_tests_log(path));
  if (!options.into.empty()) check_same_gpu(logs, profile, options, notes);

  std::map<CurveKey, std::vector<documents::MeasuredSample>> samples;
  std::map<CurveKey, std::vector<std::string>> sources;
  std::vector<std::string> hosts, versions, files;
  int ranks = 0;
  for (const auto& log : logs) {
    const CurveKey key = key_of(log, options);
    auto& s = samples[key];
    s.insert(s.end(), log.samples.begin(), log.samples.end());
    sources[key].push_back(std::filesystem::path(log.path).filename().string());
    files.push_back(std::filesystem::path(log.path).filename().string());
    for (const auto& h : log.hosts) add_once(hosts, h);
    if (!log.nccl_version.empty()) add_once(versions, log.nccl_version);
    ranks = std::max(ranks, key.ranks);
  }

  CalibrationRecord record;
  record.date = utc_timestamp();
  record.backend = "nccl";
  record.host = fmt::format("{}", fmt::join(hosts, ","));
  record.library = versions.empty() ? "NCCL (version not in the logs)"
                                    : fmt::format("NCCL {}", fmt::join(versions, ", "));
  record.ranks = ranks;
  for (auto& [key, s] : samples) {
    FittedCurve curve{key.op, key.ranks, key.tier, fit_piecewise(s, options.fit), options.fit};
    fmt::print(notes, "# {}, {} ranks, {} (from {}):\n", documents::traits(key.op).name, key.ranks,
               documents::tier_name(key.tier), fmt::join(sources[key], ", "));
    print_fit(notes, curve.fit);
    record.curves.push_back(std::move(curve));
  }
  if (!allow_poor_fits(record, options.accept_poor_fit, notes)) return 1;

  record.extra = {
      {"imported_from", files},
      {"import_note", "nccl-tests logs, out-of-place time column; date is the import's"}};
  const nlohmann::json section = calibration_to_json(record);

  if (options.into.empty()) {
    const std::string document = core::json_text(
        {{"schema_version", 1}, {"generator", core::generator()}, {"calibration", section}}, 2);
    if (options.out.empty()) {
      out << document << '\n';
    } else {
      core::write_file(options.out, document + "\n", "--out");
      fmt::print(notes, "# wrote the calibration section to {}\n", options.out);
    }
    return 0;
  }
  const nlohmann::json merged = merge_calibration(profile, section);
  if (to_stdout) {
    documents::hardware_from_json(merged, std::filesystem::path(options.into).stem().string());
    out << core::json_text(merged, 2) << '\n';
    return 0;
  }
  const std::string target = merge_destination(options.into, options.out);
  documents::hardware_from_json(merged,
                                std::filesystem::path(target).stem().string());  // validates
  core::write_file(target, core::json_text(merged, 2) + "\n",
                   options.out.empty() ? "--into" : "--out");
  fmt::print(notes, "# wrote {} (calibration merged into {})\n", target, options.into);
  return 0;
}

}  // namespace shardplan::calibrate
