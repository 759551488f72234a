// Run document (the executor's run.json) -> planner::validate_json / validate_table, against a
// fixed plan written by plan_to_json. An accepted run renders its comparison table.
#include <string>

#include "documents/model.hpp"
#include "documents/plan.hpp"
#include "fuzz_common.hpp"
#include "planner/validate.hpp"

using namespace shardplan;

namespace {

nlohmann::json plan_document() {
  documents::Plan p;
  p.model = documents::load_model("gpt2");
  p.hardware = "a100-sxm4-80gb";
  p.cluster = {2, 8};
  p.job.seq_len = 256;
  p.job.global_batch = 4;
  p.job.micro_batch = 2;
  p.spec = documents::make_spec("zero3", std::nullopt, 8);
  p.prediction.peak_bytes = 3e9;
  p.prediction.at_peak = {1e9, 1e9, 5e8, 4e8, 1e8, 0};
  p.prediction.step_s = 0.5;
  p.prediction.compute_s = 0.4;
  p.prediction.exposed_comm_s = 0.1;
  p.prediction.comm_bytes_per_gpu = 1e9;
  p.prediction.peak_when = "backward of block 0";
  return documents::plan_to_json(p);
}

}  // namespace

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const nlohmann::json plan = plan_document();
  const auto run = fuzz::json_of(data, size);
  if (!run) return 0;
  fuzz::accept_input_error([&] {
    const std::string table = planner::validate_table(plan, *run);
    fuzz::require(!table.empty(), "an accepted run renders a table");
  });
  return 0;
}
