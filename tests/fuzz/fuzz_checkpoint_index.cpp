// The sharded checkpoint's index (executor/checkpoint.cpp): a document a resume trusts to place
// byte ranges, so what it accepts must describe ranges that fit their units and their files, each
// with its digest, and a step a run can continue without wrapping.
#include "executor/checkpoint.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  fuzz::accept_input_error([&] {
    const auto index = executor::checkpoint_index_from_json(*doc);
    for (const auto& file : index.files)
      for (const auto& s : file.segments) {
        fuzz::require(s.unit >= 0 && s.unit < static_cast<std::int64_t>(index.unit_elements.size()),
                      "a segment's unit exists");
        fuzz::require(0 <= s.begin && s.begin < s.end &&
                          s.end <= index.unit_elements[static_cast<std::size_t>(s.unit)],
                      "a segment's range lies inside its unit");
        fuzz::require(s.offset_bytes >= 0 && s.offset_bytes + (s.end - s.begin) * 4 <= file.bytes,
                      "a segment's bytes lie inside its file");
        fuzz::require(s.sha256.size() == 64, "a segment has its digest");
      }
    // Step numbers and byte counts stay far from what int64 holds: the run adds to them.
    fuzz::require(index.step >= 0 && index.step <= executor::kMaxCheckpointStep,
                  "the step is one a run may continue");
    for (const auto& file : index.files)
      fuzz::require(file.bytes <= (std::int64_t{1} << 53), "a file's size is bounded");
  });
  return 0;
}
