#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/text.hpp"

using shardplan::core::closest_name;
using shardplan::core::json_text;
using shardplan::core::printable;

TEST_CASE("text::printable escapes control bytes and bytes that are not UTF-8") {
  CHECK(printable("plan.json") == "plan.json");
  CHECK(printable("m\xff\xfe.json") == "m\\xff\\xfe.json");
  CHECK(printable(std::string("g/\0..", 5)) == "g/\\x00..");
  CHECK(printable("a\nb\tc\x7f") == "a\\x0ab\\x09c\\x7f");
  CHECK(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  // Overlong forms, surrogates, cut sequences and code points past U+10FFFF are not UTF-8.
  CHECK(printable("\xc0\xaf") == "\\xc0\\xaf");
  CHECK(printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  CHECK(printable("x\xe2\x82") == "x\\xe2\\x82");
  CHECK(printable("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");
}

TEST_CASE("text::json_text writes a name that is not UTF-8 with U+FFFD, never throws") {
  const nlohmann::json doc = {{"path", "m\xff\xfe.json"}, {"n", 1}};
  CHECK_THROWS(doc.dump());  // what nlohmann does by default (type_error.316)
  std::string text;
  REQUIRE_NOTHROW(text = json_text(doc));
  CHECK(text == "{\"n\":1,\"path\":\"m\xef\xbf\xbd\xef\xbf\xbd.json\"}");
  CHECK(nlohmann::json::parse(text).at("path") == "m\xef\xbf\xbd\xef\xbf\xbd.json");
  CHECK(json_text(doc, 2).find("\n  \"n\": 1,\n") != std::string::npos);
}

TEST_CASE("text::the closest name is the nearest within the distance, or none") {
  const std::vector<std::string> commands = {"models",   "hardware",  "describe", "estimate",
                                             "simulate", "recommend", "compare",  "validate"};
  CHECK(closest_name("recomend", commands) == "recommend");  // one letter left out
  CHECK(closest_name("estimte", commands) == "estimate");
  CHECK(closest_name("compair", commands) == "compare");  // two letters changed
  CHECK(closest_name("plan", commands) == std::nullopt);  // nothing within two letters
  CHECK(closest_name("", commands) == std::nullopt);
  CHECK(closest_name("validate", commands, 0) == "validate");
}
