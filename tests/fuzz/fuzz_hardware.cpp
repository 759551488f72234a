// Hardware profile -> documents::hardware_from_json. An accepted profile gives finite, positive
// capacities and finite collective times from its calibrated curves.
#include <cmath>

#include "documents/hardware.hpp"
#include "fuzz_common.hpp"

using namespace shardplan;

SHARDPLAN_FUZZ_JSON_MUTATOR

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto doc = fuzz::json_of(data, size);
  if (!doc) return 0;
  fuzz::accept_input_error([&] {
    const auto p = documents::hardware_from_json(*doc, "fuzz");
    fuzz::require(std::isfinite(p.memory_bytes) && p.memory_bytes > 0, "finite positive memory");
    fuzz::require(p.peak(documents::DType::bf16) > 0, "a positive peak");
    if (p.calibration)
      for (const auto& c : p.calibration->collectives)
        for (double bytes : {0.0, 1.0, 1e6, 1e12})
          fuzz::require(std::isfinite(c.time_s(bytes)), "a calibrated curve gives finite times");
    (void)documents::hardware_to_json(p).dump();
  });
  return 0;
}
