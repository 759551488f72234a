// nccl-tests log (plain text) -> calibrate::parse_nccl_tests_log; every accepted sample has a
// finite positive size and time, and the strings read can be written into a JSON document.
#include <cmath>
#include <string>

#include "calibrate/nccl_tests_log.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)calibrate::collective_named_in(text);
  fuzz::accept_input_error([&] {
    const auto log = calibrate::parse_nccl_tests_log(text, "fuzz/all_reduce_perf.log");
    fuzz::require(!log.samples.empty(), "an accepted log has samples");
    // calibrate writes what it read into a profile (JSON): every string must survive dump().
    (void)nlohmann::json(
        {{"hosts", log.hosts}, {"type", log.data_type}, {"nccl", log.nccl_version}})
        .dump();
    for (const auto& s : log.samples)
      fuzz::require(std::isfinite(s.size_bytes) && s.size_bytes > 0 && std::isfinite(s.time_s) &&
                        s.time_s > 0,
                    "samples are finite and positive");
  });
  return 0;
}
