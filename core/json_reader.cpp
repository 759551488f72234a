#include "core/json_reader.hpp"

#include <cmath>

#include <fmt/format.h>

#include "core/text.hpp"

namespace shardplan::core {

namespace {

// Documents nest a few levels; nlohmann's copy, comparison and dump recurse once per level, so a
// hostile document of a few hundred kilobytes of '[' would overflow the stack long after parsing.
constexpr int kMaxNesting = 100;

// The offset of the first '[' or '{' nested deeper than kMaxNesting outside strings, or npos.
std::size_t too_deep_at(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  if (const auto at = too_deep_at(text); at != std::string::npos)
    throw InputError(source,
                     fmt::format("nested deeper than {} levels (byte {})", kMaxNesting, at));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(source, fmt::format("not valid JSON (byte {})", e.byte));
  } catch (const nlohmann::json::out_of_range& e) {
    // A number beyond a double (1e400) is valid syntax that nlohmann reports as out_of_range.
    const std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow ..."
    const auto text_at = what.find("] ");
    throw InputError(source,
                     fmt::format("not valid JSON ({})",
                                 text_at == std::string::npos ? what : what.substr(text_at + 2)));
  }
}

nlohmann::json read_json_file(const std::string& path, std::int64_t limit_bytes) {
  return parse_json_text(core::read_file(path, limit_bytes), core::printable(path));
}

InputError error_in_file(const std::string& path, const InputError& error) {
  if (!error.where().starts_with('/') || error.where() == core::printable(path)) return error;
  return InputError(core::printable(path), error.what());
}

std::string describe_value(const nlohmann::json& value) {
  std::string s = core::json_text(value);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

ObjectReader::ObjectReader(const nlohmann::json& object, std::string pointer)
    : object_(object), pointer_(std::move(pointer)) {
  if (!object_.is_object())
    throw InputError(pointer_.empty() ? "/" : pointer_,
                     "must be an object, got " + describe_value(object_));
}

bool ObjectReader::has(std::string_view key) const { return object_.contains(key); }

void ObjectReader::fail(std::string_view key, const std::string& message) const {
  throw InputError(pointer_of(key), message);
}

const nlohmann::json& ObjectReader::get(std::string_view key) const {
  auto it = object_.find(key);
  if (it == object_.end()) fail(key, "missing key");
  return *it;
}

double ObjectReader::checked_number(std::string_view key, const nlohmann::json& v,
                                    Range range) const {
  if (!v.is_number()) fail(key, "must be a number, got " + describe_value(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(key, "must be finite, got " + describe_value(v));
  const bool low = range.min_exclusive ? !(x > range.min) : !(x >= range.min);
  if (low) {
    if (range.min_exclusive)
      fail(key, fmt::format("must be > {}, got {}", range.min, describe_value(v)));
    fail(key, fmt::format("must be >= {}, got {}", range.min, describe_value(v)));
  }
  if (x > range.max) fail(key, fmt::format("must be <= {}, got {}", range.max, describe_value(v)));
  return x;
}

double ObjectReader::number(std::string_view key, Range range) {
  const auto& v = get(key);
  used_.emplace(key);
  return checked_number(key, v, range);
}

std::optional<double> ObjectReader::optional_number(std::string_view key, Range range) {
  if (!has(key) || get(key).is_null()) {
    if (has(key)) used_.emplace(key);
    return std::nullopt;
  }
  return number(key, range);
}

std::int64_t ObjectReader::integer(std::string_view key, Range range) {
  const auto& v = get(key);
  used_.emplace(key);
  // 3.0 written by a tool is still the integer 3; 3.5 is not.
  if (!v.is_number()) fail(key, "must be an integer, got " + describe_value(v));
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.0e15)
      fail(key, "must be an integer, got " + describe_value(v));
  }
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    fail(key, "is too large, got " + describe_value(v));
  const double x = checked_number(key, v, range);
  (void)x;
  return v.is_number_float() ? static_cast<std::int64_t>(v.get<double>()) : v.get<std::int64_t>();
}

std::optional<std::int64_t> ObjectReader::optional_integer(std::string_view key, Range range) {
  if (!has(key) || get(key).is_null()) {
    if (has(key)) used_.emplace(key);
    return std::nullopt;
  }
  return integer(key, range);
}

bool ObjectReader::boolean(std::string_view key) {
  const auto& v = get(key);
  used_.emplace(key);
  if (!v.is_boolean()) fail(key, "must be true or false, got " + describe_value(v));
  return v.get<bool>();
}

std::optional<bool> ObjectReader::optional_boolean(std::string_view key) {
  if (!has(key) || get(key).is_null()) {
    if (has(key)) used_.emplace(key);
    return std::nullopt;
  }
  return boolean(key);
}

std::string ObjectReader::string(std::string_view key) {
  const auto& v = get(key);
  used_.emplace(key);
  if (!v.is_string()) fail(key, "must be a string, got " + describe_value(v));
  return v.get<std::string>();
}

std::optional<std::string> ObjectReader::optional_string(std::string_view key) {
  if (!has(key) || get(key).is_null()) {
    if (has(key)) used_.emplace(key);
    return std::nullopt;
  }
  return string(key);
}

std::string ObjectReader::choice(std::string_view key, const std::vector<std::string>& choices) {
  std::string s = string(key);
  for (const auto& c : choices)
    if (c == s) return s;
  fail(key, fmt::format("must be one of {}, got \"{}\"", fmt::join(choices, ", "), s));
}

const nlohmann::json& ObjectReader::object(std::string_view key) {
  const auto& v = get(key);
  used_.emplace(key);
  if (!v.is_object()) fail(key, "must be an object, got " + describe_value(v));
  return v;
}

const nlohmann::json& ObjectReader::array(std::string_view key) {
  const auto& v = get(key);
  used_.emplace(key);
  if (!v.is_array()) fail(key, "must be an array, got " + describe_value(v));
  return v;
}

const nlohmann::json* ObjectReader::optional_object(std::string_view key) {
  if (!has(key)) return nullptr;
  return &object(key);
}

const nlohmann::json* ObjectReader::optional_array(std::string_view key) {
  if (!has(key)) return nullptr;
  return &array(key);
}

void ObjectReader::ignore(std::string_view key) {
  if (has(key)) used_.emplace(key);
}

void ObjectReader::finish() const {
  for (auto it = object_.begin(); it != object_.end(); ++it)
    if (!used_.contains(it.key())) throw InputError(pointer_of(it.key()), "unknown key");
}

}  // namespace shardplan::core
