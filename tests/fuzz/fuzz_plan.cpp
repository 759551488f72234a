// Plan document -> documents::plan_from_json; an accepted plan writes back (plan_to_json) to a
// document that reads again and writes the same document.
#include "documents/plan.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  fuzz::accept_input_error([&] {
    const auto plan = documents::plan_from_json(*doc);
    const auto written = documents::plan_to_json(plan);
    const auto again =
        fuzz::must_read([&] { return documents::plan_from_json(written); }, "a written plan");
    fuzz::require(documents::plan_to_json(again) == written,
                  "plan_to_json then plan_from_json gives the same plan");
  });
  return 0;
}
