#include <doctest/doctest.h>

#include "core/json_reader.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::core;
using nlohmann::json;

TEST_CASE("json_reader::unknown key is named") {
  const json j = {{"gpus", 8}, {"gpsu", 8}};
  ObjectReader r(j, "/cluster");
  CHECK(r.integer("gpus") == 8);
  CHECK(error_of([&] { r.finish(); }) == "/cluster/gpsu: unknown key");
}

TEST_CASE("json_reader::missing key, wrong type, range") {
  const json j = {{"a", "x"}, {"b", -8}, {"c", 2.5}, {"d", 0}};
  ObjectReader r(j, "/gpu");
  CHECK(error_of([&] { r.number("zz"); }) == "/gpu/zz: missing key");
  CHECK(error_of([&] { r.number("a"); }) == "/gpu/a: must be a number, got \"x\"");
  CHECK(error_of([&] { r.number("b", Range::positive()); }) == "/gpu/b: must be > 0, got -8");
  CHECK(error_of([&] { r.integer("c"); }) == "/gpu/c: must be an integer, got 2.5");
  CHECK(error_of([&] { r.integer("d", Range{1, 10, false}); }) == "/gpu/d: must be >= 1, got 0");
  CHECK(error_of([&] { r.boolean("d"); }) == "/gpu/d: must be true or false, got 0");
  CHECK(error_of([&] { r.choice("a", {"p", "q"}); }) == "/gpu/a: must be one of p, q, got \"x\"");
}

TEST_CASE("json_reader::not an object and not JSON") {
  CHECK(error_of([] { ObjectReader r(json::array(), ""); }) == "/: must be an object, got []");
  CHECK(error_of([] {
          parse_json_text("{\"a\": ", "job.json");
        }).rfind("job.json: not valid JSON", 0) == 0);
}
