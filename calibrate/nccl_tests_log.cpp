#include "calibrate/nccl_tests_log.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "core/file_reader.hpp"
#include "core/input_error.hpp"
#include "core/text.hpp"

namespace shardplan::calibrate {
namespace {

using core::InputError;

// A log has a few hundred lines (one per size); a bound far above that still refuses /dev/zero or
// a file given by mistake before it fills the memory.
constexpr std::int64_t kLogBytes = std::int64_t{64} << 20;  // 64 MiB

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::optional<double> to_number(const std::string& text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Host names and type names are ASCII; anything else (a Latin-1 byte, a binary file) would break
// the JSON profile they are written into.
bool is_printable_ascii(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
}

bool is_unsigned_integer(const std::string& text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The collective run by a binary named on a line ("/opt/nccl-tests/build/all_reduce_perf -b 8").
std::optional<documents::Collective> binary_named_on(const std::vector<std::string>& words) {
  for (const auto& w : words) {
    const std::string base =
        w.substr(w.find_last_of('/') == std::string::npos ? 0 : w.find_last_of('/') + 1);
    for (const auto& t : documents::collective_table())
      if (base == t.nccl_tests) return t.op;
  }
  return std::nullopt;
}

// "nccl-library=21903" -> "2.19.3"
std::string nccl_version_in(const std::vector<std::string>& words) {
  for (const auto& w : words) {
    if (w.rfind("nccl-library=", 0) != 0) continue;
    int code = 0;
    const std::string digits = w.substr(13);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), code);
    if (error == std::errc() && code > 0)
      return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  }
  return "";
}

}  // namespace

std::optional<documents::Collective> collective_named_in(const std::string& text) {
  std::optional<documents::Collective> found;
  std::size_t longest = 0;
  for (const auto& t : documents::collective_table()) {
    for (const std::string_view name : {std::string_view(t.nccl_tests), std::string_view(t.name)}) {
      if (name.size() > longest && text.find(name) != std::string::npos) {
        longest = name.size();
        found = t.op;
      }
    }
  }
  return found;
}

namespace {

// Where the columns of the table are, from its header line.
struct TableColumns {
  std::size_t time = 0;  // index of the out-of-place time among a row's words
  std::optional<std::size_t> count, type, wrong;
};

// Bytes of an element of nccl-tests' type names (src/common.cu, test_typenames); 0: unknown.
double type_bytes(const std::string& type) {
  static const std::pair<const char*, double> kTypes[] = {
      {"int8", 1},   {"uint8", 1},  {"int32", 4},    {"uint32", 4},  {"int64", 8},
      {"uint64", 8}, {"half", 2},   {"float", 4},    {"double", 8},  {"bfloat16", 2},
      {"f8e4m3", 1}, {"f8e5m2", 1}, {"fp8_e4m3", 1}, {"fp8_e5m2", 1}};
  for (const auto& [name, bytes] : kTypes)
    if (type == name) return bytes;
  return 0;
}

// The rows a run can have measured: a finite time of at most kMaxRowTimeUs; a size that is the
// count times the type's bytes, once (all_reduce, broadcast, ...) or once per rank (all_gather
// and reduce_scatter count every rank's part; the log's rank lines say how many, else up to
// 2^20); an algorithm bandwidth of at most kMaxAlgorithmBandwidth.
std::string impossible_row(double size, double time_us, std::optional<double> count,
                           double element_bytes, int ranks) {
  if (!std::isfinite(time_us) || time_us > kMaxRowTimeUs)
    return fmt::format("a time of {} us is not a measurement (at most {} us, an hour)", time_us,
                       kMaxRowTimeUs);
  if (count && element_bytes > 0 && size > 0) {
    const double ratio = size / (*count * element_bytes);
    const bool whole = ratio >= 1 && ratio == std::floor(ratio);
    if (!whole || (ranks > 0 ? ratio != 1 && ratio != ranks : ratio > 1048576))
      return fmt::format("size {} is not the count {} times {} bytes{}", size, *count,
                         element_bytes,
                         ranks > 0 ? fmt::format(" (times 1 or {} ranks)", ranks) : "");
  }
  if (size / (time_us * 1e-6) > kMaxAlgorithmBandwidth)
    return fmt::format("{} bytes in {} us is {:.4g} GB/s, beyond any link ({} GB/s at most)", size,
                       time_us, size / (time_us * 1e-6) / 1e9, kMaxAlgorithmBandwidth / 1e9);
  return "";
}

// A comment line before the table: a rank line ("#  Rank  3 Group  0 Pid  1234 on node01
// device  3 [0x..] NVIDIA ...") or the column headers. Returns the columns at the header line.
std::optional<TableColumns> read_comment_before_table(const std::vector<std::string>& words,
                                                      const std::string& where, NcclTestsLog& log) {
  std::vector<std::string> columns(words.begin(), words.end());
  if (columns.front() == "#")
    columns.erase(columns.begin());
  else
    columns.front().erase(0, 1);
  if (!columns.empty() && columns.front() == "Rank") {
    ++log.ranks;
    const auto on = std::find(columns.begin(), columns.end(), "on");
    if (on != columns.end() && on + 1 != columns.end() && !is_printable_ascii(*(on + 1)))
      throw InputError(where, "the host name after \"on\" is not printable ASCII");
    if (on != columns.end() && on + 1 != columns.end() &&
        std::find(log.hosts.begin(), log.hosts.end(), *(on + 1)) == log.hosts.end())
      log.hosts.push_back(*(on + 1));
    // "... device  3 [0x47] NVIDIA A100-SXM4-80GB": the name is the rest of the line.
    const auto bus = std::find_if(columns.begin(), columns.end(),
                                  [](const std::string& w) { return w.rfind("[0x", 0) == 0; });
    if (bus != columns.end() && bus + 1 != columns.end()) {
      std::string device;
      for (auto w = bus + 1; w != columns.end(); ++w) {
        if (!is_printable_ascii(*w))
          throw InputError(where, "the device name after the bus id is not printable ASCII");
        device += (device.empty() ? "" : " ") + *w;
      }
      if (std::find(log.devices.begin(), log.devices.end(), device) == log.devices.end())
        log.devices.push_back(device);
    }
    return std::nullopt;
  }
  const auto time = std::find(columns.begin(), columns.end(), "time");
  const bool sizes = !columns.empty() && (columns.front() == "size" || columns.front() == "bytes");
  if (!sizes || time == columns.end()) return std::nullopt;
  TableColumns table;
  table.time = static_cast<std::size_t>(time - columns.begin());
  const auto type = std::find(columns.begin(), columns.end(), "type");
  if (type != columns.end() && type < time)
    table.type = static_cast<std::size_t>(type - columns.begin());
  const auto count = std::find(columns.begin(), columns.end(), "count");
  if (count != columns.end() && count < time)
    table.count = static_cast<std::size_t>(count - columns.begin());
  // time, algbw, busbw, then "#wrong" (or "error" in older versions)
  if (table.time + 3 < columns.size()) table.wrong = table.time + 3;
  return table;
}

// One row of the table; a sample unless its size is 0 (nothing was sent: too few elements for
// every rank to get one).
void read_row(const std::string& line, const std::vector<std::string>& words,
              const TableColumns& table, const std::string& where, NcclTestsLog& log) {
  const double size =
      is_unsigned_integer(words.front()) ? to_number(words.front()).value_or(-1.0) : -1.0;
  const double time_us =
      words.size() > table.time ? to_number(words[table.time]).value_or(-1.0) : -1.0;
  if (size < 0 || !(time_us > 0))
    throw InputError(
        where,
        fmt::format("expected a table row (size, count, type, redop, root, time, algbw, busbw, "
                    "#wrong, ...) with a positive time in column {}, got \"{}\"",
                    table.time + 1, line.size() > 100 ? line.substr(0, 97) + "..." : line));
  const auto& wrong = table.wrong;
  if (wrong && words.size() > *wrong && is_unsigned_integer(words[*wrong]) && words[*wrong] != "0")
    throw InputError(
        where,
        fmt::format("#wrong is {}: nccl-tests found wrong results at this size; the run is not "
                    "a valid measurement",
                    words[*wrong]));
  if (table.type && words.size() > *table.type) {
    const auto& type = words[*table.type];
    if (!is_printable_ascii(type))
      throw InputError(
          where, fmt::format("the type in column {} is not printable ASCII", *table.type + 1));
    if (log.data_type.empty())
      log.data_type = type;
    else if (log.data_type != type)
      throw InputError(where, fmt::format("the log mixes types {} and {}; give one type per log",
                                          log.data_type, type));
  }
  std::optional<double> count;
  if (table.count && words.size() > *table.count && is_unsigned_integer(words[*table.count]))
    count = to_number(words[*table.count]);
  const std::string impossible =
      impossible_row(size, time_us, count, type_bytes(log.data_type), log.ranks);
  if (!impossible.empty()) throw InputError(where, impossible);
  if (size == 0) return;
  log.samples.push_back({size, time_us * 1e-6});
}

}  // namespace

NcclTestsLog parse_nccl_tests_log(const std::string& text, const std::string& path) {
  NcclTestsLog log;
  log.path = path;
  std::istringstream in(text);
  std::string line;
  int line_number = 0;
  int header_line = 0;  // line of the column headers, 0 before it
  TableColumns table;
  bool summary_seen = false;  // "# Avg bus bandwidth"
  int last_row_line = 0;
  auto where = [&](int n) { return fmt::format("{}:{}", path, n); };

  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto words = split_words(line);
    if (words.empty()) continue;
    const bool comment = words.front().front() == '#';
    if (header_line == 0) {
      if (!log.op) log.op = binary_named_on(words);
      if (log.nccl_version.empty()) log.nccl_version = nccl_version_in(words);
      if (!comment) continue;  // the command line, NCCL's INFO lines, ...
      if (const auto header = read_comment_before_table(words, where(line_number), log)) {
        header_line = line_number;
        table = *header;
      }
      continue;
    }
    if (comment) {
      if (line.find("Avg bus bandwidth") != std::string::npos) summary_seen = true;
      continue;
    }
    if (line.find("NCCL INFO") != std::string::npos || line.find("NCCL WARN") != std::string::npos)
      continue;
    if (summary_seen)
      throw InputError(where(line_number),
                       "a row after the '# Avg bus bandwidth' line (two tables in one log?)");
    read_row(line, words, table, where(line_number), log);
    last_row_line = line_number;
  }

  if (header_line == 0)
    throw InputError(path, "no nccl-tests table: no \"#  size  count  type ... time\" header line");
  if (last_row_line == 0) throw InputError(where(header_line), "the table has no rows");
  if (log.samples.empty())
    throw InputError(where(header_line), "the table has no row with a size above 0");
  if (!summary_seen)
    throw InputError(
        where(last_row_line),
        "truncated: the table is not followed by nccl-tests' \"# Avg bus bandwidth\" line");
  if (!log.op) log.op = collective_named_in(std::filesystem::path(path).filename().string());
  return log;
}

NcclTestsLog read_nccl_tests_log(const std::string& path) {
  return parse_nccl_tests_log(core::read_file(path, kLogBytes), core::printable(path));
}

}  // namespace shardplan::calibrate
