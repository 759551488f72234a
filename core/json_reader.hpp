// Strict reading of JSON documents: every key must be known and read, every value has its type and
// range checked, and every error names the JSON pointer and the value. One reader serves every
// document of the project (models, hardware profiles, jobs, plans, runs).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_reader.hpp"
#include "core/input_error.hpp"

namespace shardplan::core {

// Parses text as JSON; a syntax error becomes an InputError at `source`.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);
// Reads a whole file (core::read_file: a regular file of at most limit_bytes) and parses it; an
// unreadable file is an InputError naming the path and the reason.
nlohmann::json read_json_file(const std::string& path,
                              std::int64_t limit_bytes = core::kDocumentBytes);
// An error of the document read from `path`: one at a JSON pointer gains the file's name in front
// ("plan.json: /schema_version: missing key"); one at a flag or at the file itself is kept.
InputError error_in_file(const std::string& path, const InputError& error);
// parse(read_json_file(path)), its errors named as error_in_file names them.
template <class Parse> auto read_json_document(const std::string& path, Parse&& parse) {
  const nlohmann::json document = read_json_file(path);
  try {
    return parse(document);
  } catch (const InputError& e) {
    throw error_in_file(path, e);
  }
}
// A short rendering of a value for error messages (strings quoted, long values cut).
std::string describe_value(const nlohmann::json& value);

struct Range {
  double min = -1e300;  // inclusive unless min_exclusive
  double max = 1e300;   // inclusive
  bool min_exclusive = false;
  static Range positive() { return {0.0, 1e300, true}; }
  static Range non_negative() { return {0.0, 1e300, false}; }
  static Range between(double lo, double hi) { return {lo, hi, false}; }
};

class ObjectReader {
public:
  // pointer: the JSON pointer of `object` in its document ("" for the root).
  ObjectReader(const nlohmann::json& object, std::string pointer);

  bool has(std::string_view key) const;
  std::string pointer_of(std::string_view key) const { return pointer_ + "/" + std::string(key); }

  double number(std::string_view key, Range range = {});
  std::optional<double> optional_number(std::string_view key, Range range = {});
  std::int64_t integer(std::string_view key, Range range = {});
  std::optional<std::int64_t> optional_integer(std::string_view key, Range range = {});
  bool boolean(std::string_view key);
  std::optional<bool> optional_boolean(std::string_view key);
  std::string string(std::string_view key);
  std::optional<std::string> optional_string(std::string_view key);
  // A string that must be one of `choices`.
  std::string choice(std::string_view key, const std::vector<std::string>& choices);
  const nlohmann::json& object(std::string_view key);
  const nlohmann::json& array(std::string_view key);
  const nlohmann::json* optional_object(std::string_view key);
  const nlohmann::json* optional_array(std::string_view key);
  // Marks a key as read without interpreting it (metadata such as "source" notes).
  void ignore(std::string_view key);
  // Marks every key that satisfies `pred` as read.
  template <class Pred> void ignore_if(Pred pred) {
    for (auto it = object_.begin(); it != object_.end(); ++it)
      if (pred(it.key())) used_.insert(it.key());
  }

  // Throws on the first key that was never read: "/gpu/memroy_GiB: unknown key".
  void finish() const;

private:
  const nlohmann::json& get(std::string_view key) const;
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  double checked_number(std::string_view key, const nlohmann::json& v, Range range) const;

  const nlohmann::json& object_;
  std::string pointer_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace shardplan::core
