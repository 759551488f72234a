// HF config.json -> documents::model_from_hf_config. An accepted model must have counts that fit
// their 64-bit integers and a parameter table that renders.
#include "documents/model.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  fuzz::accept_input_error([&] {
    const auto m = documents::model_from_hf_config(*doc, "fuzz/config.json");
    fuzz::require(m.total_params() > 0, "an accepted model has parameters");
    const auto table = documents::model_to_json(m);
    fuzz::require(table.at("params").get<std::int64_t>() == m.total_params(),
                  "the parameter table agrees with total_params");
  });
  return 0;
}
