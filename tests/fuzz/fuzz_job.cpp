// Training-job document -> documents::job_from_json; an accepted job writes back to a document
// that reads as the same job, and checking it against clusters only ever raises InputError.
#include "documents/job.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

namespace {
bool same(const documents::TrainingJob& a, const documents::TrainingJob& b) {
  return a.seq_len == b.seq_len && a.global_batch == b.global_batch &&
         a.micro_batch == b.micro_batch && a.precision == b.precision &&
         a.optimizer == b.optimizer && a.checkpointing == b.checkpointing &&
         a.checkpoint_every == b.checkpoint_every && a.attention == b.attention &&
         a.loss == b.loss && a.loss_chunks == b.loss_chunks && a.recipe == b.recipe;
}
}  // namespace

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  fuzz::accept_input_error([&] {
    const auto job = documents::job_from_json(*doc);
    const auto again = fuzz::must_read(
        [&] { return documents::job_from_json(documents::job_to_json(job)); }, "a written job");
    fuzz::require(same(again, job), "job_to_json then job_from_json gives the same job");
    for (documents::Cluster c : {documents::Cluster{1, 1}, documents::Cluster{8, 8},
                                 documents::Cluster{1'000'000, 8}, documents::Cluster{999'999, 1}})
      fuzz::accept_input_error([&] { documents::validate_job(job, c); });
  });
  return 0;
}
