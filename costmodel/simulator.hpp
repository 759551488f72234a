// A discrete-event simulation of one optimizer step: a compute stream and communication streams
// (all-gather, reduce-scatter, all-reduce, host transfers) with the frameworks' dependency rules
// (prefetch depth, in-flight all-gather limit, bucket readiness, reshard after forward), and
// every allocation and free on one memory timeline. Step time, exposed communication, the memory
// curve and its peak with the breakdown at the peak all come from this one walk.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "costmodel/comm_model.hpp"
#include "costmodel/compute_time.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/plan.hpp"
#include "documents/sharding.hpp"

namespace shardplan::costmodel {

// context: ring attention's exchanges of keys and values (context parallelism).
// tensor: tensor parallelism's collectives of the activations (blocking the compute stream unless
// async tensor parallelism overlaps them with the GEMMs).
enum class Stream { compute, all_gather, reduce_scatter, all_reduce, host, context, tensor };
constexpr int kStreams = 7;
const char* stream_name(Stream s);

struct TraceSpan {
  Stream stream;
  std::string name;
  double start_s;
  double duration_s;
  int unit = -1;          // the unit it computes or gathers for (0: embeddings, last: head)
  bool host_cpu = false;  // work of the host's CPUs (the offloaded optimizer step), not a transfer
};
struct MemoryPoint {
  double time_s;
  double bytes;  // allocated, all categories
};
struct Trace {
  std::vector<TraceSpan> spans;
  std::vector<MemoryPoint> memory;
};

struct StepInput {
  const documents::ModelSpec* model = nullptr;
  const documents::HardwareProfile* hardware = nullptr;
  documents::Cluster cluster;
  documents::TrainingJob job;  // micro_batch must be set (> 0)
  documents::ShardingSpec spec;
  Accounting accounting = Accounting::framework;
  // c: ranks sharing each sequence (ring attention). The walk is one rank's: it runs seq_len / c
  // tokens of each sequence, the states sharded and the gradients averaged over all the GPUs
  // (data and context ranks together), each block's attention scoring its queries against the
  // whole sequence's keys, with the ring's buffers and exchanges (context_ring.hpp).
  int context_parallel = 1;
  // t: ranks splitting each block's heads and MLP width and the head's vocabulary, as PyTorch's
  // parallel styles split them under the recipe's plan (RecipeTraits::tensor_parallel =
  // torch_styles: hf's tp_plan, torchtitan's apply_tp). The walk is one rank's: its share of each
  // unit's parameters and activations, its share of the GEMMs, and the block's collectives of
  // the activations on the tensor stream; the data-parallel ranks are the cluster's GPUs / t.
  int tensor_parallel = 1;
  bool sequence_parallel = false;      // the norms on T/t tokens, all-gather + reduce-scatter
  bool async_tensor_parallel = false;  // the collectives overlapped with the GEMMs beside them
  documents::CpRotate cp_rotate = documents::CpRotate::all_gather;  // torch's ring's keys
};

struct StepResult {
  bool valid = true;  // false: the plan is not runnable as asked (reason says why)
  std::string reason;
  std::string reason_input;  // the option that makes it so ("--offload", "--micro-batch", ...)
  std::int64_t params = 0;
  // Elements of the units this rank runs before data-parallel sharding: its share of its
  // tensor-parallel group's split of its pipeline stage (the model, without either).
  double rank_params = 0;
  std::int64_t micro_batch = 0;
  std::int64_t grad_accumulation = 0;  // micro-batches per optimizer step
  // memory, bytes per GPU
  double peak_bytes = 0;            // allocated peak + overhead (context, NCCL, fragmentation)
  double allocated_peak_bytes = 0;  // torch.cuda.max_memory_allocated()
  double reserve_bytes =
      0;  // the caching allocator's reserve on top: max_memory_reserved() − allocated
  double device_bytes = 0;
  double host_bytes_per_node =
      0;  // pinned host memory an offload plan needs on each node      // CUDA context + NCCL
          // workspace: what nvidia-smi adds to the reserved
  double capacity_bytes = 0;
  documents::Breakdown at_peak{};       // sums to peak_bytes
  double head_activations_at_peak = 0;  // of at_peak's activations, the head's: the final norm,
                                        // the logits and the loss's tensors
  documents::Breakdown model_states{};  // persistent parameters, gradients, optimizer states
  std::string peak_when;                // "backward of block 0, 2 gathered units alive"
  // time, seconds for one optimizer step (all micro-batches)
  double step_s = 0;
  double compute_s = 0;  // busy time of the compute stream (incl. recompute, optimizer)
  double recompute_s = 0;
  double optimizer_s = 0;
  double forward_per_mb_s = 0;   // one micro-batch's forward on the compute stream
  double backward_per_mb_s = 0;  // one micro-batch's backward, recompute included
  // The compute stream's busy time by kind (compute_time.hpp); sums to compute_s.
  ComputeTimes compute_by_kind_s{};
  double exposed_comm_s = 0;  // compute stream idle, waiting on communication or transfers
  double bubble_s = 0;        // compute stream idle, waiting on another pipeline stage
  std::array<double, kStreams> busy_s{};     // per stream
  std::array<double, kStreams> exposed_s{};  // compute idle attributed to each stream
  double comm_bytes_per_gpu = 0;             // bytes each GPU sends per step
  double context_bytes_per_gpu = 0;          // of them, the ring attention's (context parallelism)
  double tensor_bytes_per_gpu = 0;           // of them, tensor parallelism's
  std::array<double, documents::kCollectives>
      comm_bytes_by_op{};       // the same bytes by collective (sums to it)
  double host_optimizer_s = 0;  // an offload plan's CPU optimizer step (on the host stream)
  // Blocking collectives (a CPU profile): the time they wait for the slowest rank, in exposed_s.
  double straggler_wait_s = 0;
  double tokens_per_s = 0;  // whole job
  double model_flops = 0;   // per step, whole job, without recompute (6·tokens·params-ish)
  double mfu = 0;
  bool calibrated_comm = false;
  bool extrapolated_comm = false;
};

// Runs the simulation. Never throws for a plan that does not fit or cannot run: that is a result.
// The optional trace receives every span and the memory curve.
StepResult simulate_step(const StepInput& in, Trace* trace = nullptr);

// The step's prediction as a plan document carries it (documents/plan.hpp).
documents::PlanPrediction prediction_from(const StepResult& r);

}  // namespace shardplan::costmodel
