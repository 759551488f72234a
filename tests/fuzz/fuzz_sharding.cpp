// Sharding spec -> documents::spec_from_json; an accepted spec writes back to a document that reads
// as the same spec.
#include "documents/sharding.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  fuzz::accept_input_error([&] {
    const auto spec = documents::spec_from_json(*doc, "/sharding");
    const auto written = documents::spec_to_json(spec);
    const auto again = fuzz::must_read(
        [&] { return documents::spec_from_json(written, "/sharding"); }, "a written spec");
    fuzz::require(documents::spec_to_json(again) == written,
                  "spec_to_json then spec_from_json gives the same spec");
  });
  return 0;
}
