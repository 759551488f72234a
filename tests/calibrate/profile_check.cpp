// Test helper: loads a hardware profile through the cost model (as the planner does) and checks
// that it carries a calibration with at least the expected number of collective curves and of
// attention cores, each core with positive forward and backward times.
// CPU ranks that timed GEMMs must carry a measured straggler wait.
// Usage: profile_check PROFILE [MIN_CURVES [MIN_ATTENTION]]. Exit 0 when it does, 1 otherwise.
#include <cstdlib>
#include <exception>

#include <fmt/format.h>

#include "documents/hardware.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: profile_check PROFILE [MIN_CURVES [MIN_ATTENTION]]\n");
    return 1;
  }
  try {
    const auto profile = shardplan::documents::load_hardware(argv[1]);
    const std::size_t min_curves = argc > 2 ? static_cast<std::size_t>(std::atoi(argv[2])) : 1;
    if (!profile.calibration || profile.calibration->collectives.size() < min_curves) {
      fmt::print(stderr, "{}: expected a calibration with at least {} curves\n", argv[1],
                 min_curves);
      return 1;
    }
    const std::size_t min_attention = argc > 3 ? static_cast<std::size_t>(std::atoi(argv[3])) : 0;
    const auto& attention = profile.calibration->attention;
    if (attention.size() < min_attention) {
      fmt::print(stderr, "{}: expected at least {} attention cores, found {}\n", argv[1],
                 min_attention, attention.size());
      return 1;
    }
    for (const auto& a : attention) {
      fmt::print("attention {} {} batch {} seq {} heads {}/{} head_dim {}: forward {:.1f} us, "
                 "backward {:.1f} us\n",
                 a.impl, shardplan::documents::dtype_name(a.dtype), a.batch, a.seq, a.heads,
                 a.kv_heads, a.head_dim, a.forward_s * 1e6, a.backward_s * 1e6);
      if (!(a.forward_s > 0 && a.backward_s > 0)) {
        fmt::print(stderr, "{}: an attention core without positive times\n", argv[1]);
        return 1;
      }
    }
    // CPU ranks that timed GEMMs also timed the straggler wait of a blocking collective.
    const auto& cal = *profile.calibration;
    if (cal.backend == "mpi" && cal.ranks >= 2 && !cal.gemm.empty()) {
      if (!cal.straggler_wait || cal.straggler_wait->ranks != cal.ranks ||
          !(cal.straggler_wait->fraction >= 0) || !(cal.straggler_wait->segment_s > 0)) {
        fmt::print(stderr, "{}: expected a straggler wait measured on {} ranks\n", argv[1],
                   cal.ranks);
        return 1;
      }
      fmt::print("straggler wait on {} ranks: {:.2f}% of a {:.1f} us segment\n", cal.ranks,
                 100 * cal.straggler_wait->fraction, cal.straggler_wait->segment_s * 1e6);
    }
    for (const auto& c : profile.calibration->collectives)
      fmt::print("{} {} ranks {}: {} pieces, median error {:.1f}%, max {:.1f}%\n",
                 shardplan::documents::traits(c.op).name, c.ranks,
                 shardplan::documents::tier_name(c.tier), c.segments.size(),
                 100 * c.median_rel_error, 100 * c.max_rel_error);
    fmt::print("{}: {} ({} per node), peak fp32 {:.3f} TFLOP/s, efficiency {:.2f}\n", argv[1],
               profile.device, profile.gpus_per_node,
               profile.peak(shardplan::documents::DType::fp32) / 1e12, profile.compute_efficiency);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
