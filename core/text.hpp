// Bytes from the user (paths, names) as they are shown: in messages, and in JSON documents.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardplan::core {

// `text` for a one-line message: control bytes (NUL, newline, ...) and bytes that are not part of
// valid UTF-8 are written as \xNN, so nothing is cut or garbled ("g/\x00..", "m\xff\xfe.json").
std::string printable(std::string_view text);

// `document` as JSON text (indent as nlohmann::json::dump: -1 compact, n spaces per level).
// Strings that are not valid UTF-8 (a file name with byte 0xff) never fail the dump: each invalid
// byte becomes U+FFFD (the replacement character), as SECURITY.md says.
std::string json_text(const nlohmann::json& document, int indent = -1);

// Of `names`, the one `given` most likely meant: the nearest by edit distance (letters changed,
// inserted or deleted; Levenshtein), if it is within `within` letters ("recomend" -> "recommend").
std::optional<std::string>
closest_name(std::string_view given, const std::vector<std::string>& names, std::size_t within = 2);

}  // namespace shardplan::core
