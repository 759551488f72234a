// The run document (run.json) the executor writes: what each rank measured — peak bytes by
// category (the tracked allocator's peak and the breakdown at it), each step's time and its parts,
// the collectives' calls, time and bytes by kind, the loss per step — with the plan's prediction
// copied in, the environment, and a summary that `planner validate` compares with the prediction:
//
//   summary.memory.peak_bytes      highest peak over the ranks; at_peak: that rank's breakdown
//   summary.time.step_s            the slowest rank's median step (steps after the first, which
//                                  warms up: first touches, the first gradient allocations)
//   summary.time.compute_s, optimizer_s, copy_s, collectives_s: that rank's medians
//   summary.time.step_cpu_s, compute_cpu_s: the computing thread's CPU time over the same (below
//                                  the wall time when the machine's other load took the core)
//   summary.time.forward_s, backward_s: the compute's two parts (compute_s is their sum)
//   summary.time.comm_wait_s       the time the compute stream stalled on collectives (GPU, or
//                                  collective streams on CPUs), and comm_wait_by_stream_s: on
//                                  the all-gathers', the reductions' and the replica
//                                  all-reduce's streams
//   summary.time.collectives_overlap  whether collectives ran beside the compute (then the
//                                  exposed communication is comm_wait_s, else collectives_s)
//   summary.time.achieved_TFLOPs, mfu   the model's FLOPs per step (3 × the forward's, the cost
//                                  model's count, no recompute: PaLM's model FLOPs utilisation)
//                                  over the step time, and over the device's peak
//
// On the CUDA backend the memory summary is the device's: peak_bytes is the caching pool's
// highest reserved plus the CUDA context and the NCCL workspace, and at_peak's overhead holds
// those two and the pool's reserved-but-unallocated bytes, as the cost model's overhead term
// holds context, NCCL workspace and fragmentation; `device` has each of them.
//
// Every rank's record travels as a fixed-length vector of doubles (pack/unpack) so rank 0 can
// gather them with one all-gather.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/engine.hpp"
#include "executor/run_setup.hpp"
#include "executor/tracked_allocator.hpp"

namespace shardplan::executor {

struct RankRecord {
  int rank = 0;
  std::int64_t peak_bytes = 0;
  MemoryBreakdown at_peak;         // when the total peaked
  MemoryBreakdown category_peaks;  // each category's own highest
  std::int64_t capacity_bytes = 0;
  // The CUDA backend's device (device_run.hpp); 0 on the CPU backend.
  std::int64_t reserved_peak_bytes = 0;  // the caching pool's highest reserved
  std::int64_t context_bytes = 0;        // the CUDA context
  std::int64_t nccl_bytes = 0;           // the NCCL communicators' workspace
  std::vector<StepReport> steps;
};

std::vector<double> pack(const RankRecord& r);
RankRecord unpack(const std::vector<double>& v, std::size_t steps);
std::size_t packed_size(std::size_t steps);

struct RunEnvironment {
  std::string backend;             // "mpi", "nccl" or "rehearsal"
  std::string library;             // "Open MPI v4.1.4"
  std::vector<std::string> hosts;  // per rank
  bool rehearsal = false;
  int rehearsed_rank = -1;
  std::string device;     // the GPU's name on the CUDA backend; "" on CPUs
  double peak_flops = 0;  // the device's dense peak for the run's compute dtype (0: unknown)
  bool collective_streams = false;  // cpu: collectives on threads of their own (host_stream.hpp)
  // Whether collectives ran beside the compute (NCCL's streams, or collective streams): the
  // communication the step waited for is then comm_wait_s, else all of collectives_s.
  bool collectives_overlap() const { return backend == "nccl" || collective_streams; }
};

// The median of each step's value over steps 2..K (all of them when K == 1).
double steady_median(const std::vector<StepReport>& steps, double StepReport::*field);

nlohmann::json run_document(const RunSetup& setup, const ShardingEngine& engine,
                            const std::vector<RankRecord>& ranks, const RunEnvironment& env);

}  // namespace shardplan::executor
