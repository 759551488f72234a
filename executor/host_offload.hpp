// CPU offload of the optimizer (and of partitioned parameters): what the cost model's
// `offload optimizer|params` keeps off the device (costmodel/simulator.cpp) lives in a host pool,
// a TrackedAllocator of its own that the device's peak does not count, and moves as the
// frameworks move it (DeepSpeed's offload_optimizer / offload_param, stage_1_and_2.py and
// stage3.py; FSDP's CPUOffload, which offloads parameters, gradients and optimizer together):
//
//   optimizer   the fp32 master weights (DeepSpeed's master partition; under PyTorch's
//               flavours and fp32 a host copy of this rank's part of the parameters), AdamW's
//               moments and the fp32 reduced-gradient chunks are on the host. After a unit's
//               reduce-scatter its chunk goes device → host and is added into the host chunk
//               (accumulating over micro-batches); unpartitioned gradients (ZeRO-1) go
//               device → host at the step. AdamW runs on the host; the updated parameters go
//               host → device (rounded to the compute type where the device keeps 16 bits).
//   params      also the partitioned parameters at rest: a unit's chunk goes host → device into
//               its slot of the gathered buffer just before the all-gather; the optimizer then
//               updates them on the host in place (nothing goes back).
//
// On the CPU backend "host" and "device" are both the process's memory: the pool is what makes
// the split, and the copies are the ones a GPU run makes (timed as the step's copies).
#pragma once

#include <stdexcept>

#include "documents/sharding.hpp"

namespace shardplan::executor {

struct OffloadPolicy {
  bool optimizer = false;  // master, moments and reduced gradients on the host
  bool params = false;     // partitioned parameters at rest on the host too
};

// From the plan's spec. Throws std::invalid_argument for what no framework offloads (the cost
// model's check_plan refuses the same): offload without a sharded optimizer, parameter offload
// without sharded parameters, optimizer-only offload under FSDP.
OffloadPolicy offload_policy(const documents::ShardingSpec& spec);

}  // namespace shardplan::executor
