// The sharded checkpoint's index (executor/checkpoint.cpp): a document a resume trusts to place
// byte ranges, so what it accepts must describe ranges that fit their units and their files.
#include "executor/checkpoint.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc)
    return 0;
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
      }
  });
  return 0;
}
