#include "executor/host_offload.hpp"

#include <fmt/format.h>

namespace shardplan::executor {

OffloadPolicy offload_policy(const documents::ShardingSpec& spec) {
  using documents::Offload;
  OffloadPolicy p;
  if (spec.offload == Offload::none) return p;
  if (!spec.shard_optimizer)
    throw std::invalid_argument(
        fmt::format("offload {} needs sharded optimizer states (ZeRO or FSDP), {} keeps them whole",
                    documents::offload_name(spec.offload), spec.strategy));
  if (spec.offload == Offload::params && !spec.shard_parameters)
    throw std::invalid_argument(fmt::format(
        "offload params needs partitioned parameters (zero3, fsdp-full, hsdp), {} keeps them whole",
        spec.strategy));
  const bool fsdp =
      spec.flavour == documents::Flavour::fsdp1 || spec.flavour == documents::Flavour::fsdp2;
  if (spec.offload == Offload::optimizer && fsdp)
    throw std::invalid_argument(
        "FSDP offloads parameters, gradients and optimizer together (CPUOffload); use offload "
        "params");
  p.optimizer = true;
  p.params = spec.offload == Offload::params;
  return p;
}

}  // namespace shardplan::executor
