// DeepSpeed config -> planner::import_deepspeed_config, for two scenarios (one node of 8 GPUs; 128
// nodes of 8). An accepted import gives a job that validates against the scenario's cluster.
#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "fuzz_common.hpp"
#include "planner/deepspeed_import.hpp"

using namespace shardplan;

namespace {

planner::Scenario scenario(int gpus, std::int64_t global_batch) {
  planner::Scenario sc;
  sc.model = documents::load_model("llama-2-7b");
  sc.hardware = documents::load_hardware("a100-sxm4-80gb");
  sc.cluster = {gpus, 8};
  sc.job.seq_len = 4096;
  sc.job.global_batch = global_batch;
  return sc;
}

}  // namespace

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const planner::Scenario bases[] = {scenario(8, 32), scenario(1024, 2048)};
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  for (const auto& base : bases) {
    fuzz::accept_input_error([&] {
      const auto imported = planner::import_deepspeed_config(*doc, base);
      fuzz::require(imported.job.global_batch > 0, "an imported job has a global batch");
      fuzz::must_read([&] { documents::validate_job(imported.job, base.cluster); },
                      "an imported job checked against its cluster");
    });
  }
  return 0;
}
