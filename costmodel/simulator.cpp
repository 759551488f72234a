#include "costmodel/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "costmodel/compute_time.hpp"
#include "costmodel/context_ring.hpp"
#include "costmodel/elementwise.hpp"
#include "costmodel/traffic.hpp"

namespace shardplan::costmodel {
namespace {

enum class Phase : std::uint8_t { setup, forward, backward, recompute, reduce, optimizer, gather };

const char* phase_name(Phase p) {
  switch (p) {
  case Phase::setup:
    return "start of step";
  case Phase::forward:
    return "forward";
  case Phase::backward:
    return "backward";
  case Phase::recompute:
    return "recompute";
  case Phase::reduce:
    return "gradient reduction";
  case Phase::optimizer:
    return "optimizer step";
  case Phase::gather:
    return "parameter all-gather";
  }
  return "?";
}

struct MemEvent {
  double t;
  double bytes;  // + allocation, − free
  Category cat;
  Phase phase;
  std::int8_t gathered;  // +1/−1 when a gathered unit appears/disappears
  int unit;
  int micro_batch;
};

// Per-unit quantities (embeddings, one block, head): elements, seconds and bytes per micro-batch.
struct UnitInfo {
  double params = 0;     // elements
  double shardable = 0;  // elements that get partitioned (the rest stays whole)
  double gather = 0;     // elements all-gathered before use (tied head: + the embedding matrix)
  double matmul = 0;     // elements of GEMM weights (autocast copies)
  double opt_elems = 0;  // optimizer-state elements
  double fwd_s = 0, bwd_s = 0, recompute_s = 0;
  ComputeTimes fwd_kinds{};  // the forward's seconds by kind (host_overhead: the host's excess)
  ComputeTimes kinds{};      // forward and backward's seconds by kind
  double fwd_flops = 0;      // per micro-batch
  double gather_bytes = 0;   // the all-gathered unit in the compute dtype
  double gather_s = 0;       // its all-gather (plus the host upload of offloaded shards)
  double gather_sent = 0;    // bytes one rank sends for it
  ActivationBytes act;
};

std::string unit_label(int u, int units) {
  if (u == 0) return "embeddings";
  if (u == units - 1) return "head";
  return fmt::format("block {}", u - 1);
}

class Simulation {
public:
  Simulation(const StepInput& in, Trace* trace)
      : in_(in), spec_(in.spec), trace_(trace), comm_(*in.hardware),
        frameworks_(in.accounting == Accounting::framework &&
                    recipe_traits(in.job.recipe).framework) {
    if (in.accounting == Accounting::zero_paper) {
      // The paper's model states and algorithm only: no framework buffers or partition quirks,
      // ZeRO-1/2 reduce-scatter (§7).
      spec_.persistence_threshold = 0;
      spec_.all_reduce_partitions = false;
      spec_.flat_grad_partition = spec_.contiguous_grad_bucket = spec_.grad_bucket_copy = false;
      spec_.keep_root_unsharded = false;
      spec_.root_unit = false;
    }
    if (!frameworks_) spec_.root_unit = spec_.reduce_copy_in = false;
    straggler_fraction_ = in.hardware->straggler_wait_fraction(in.cluster.gpus);
    context_ = std::max(1, in.context_parallel);
  }

  StepResult run();

private:
  // Parameters every rank keeps whole although parameters are sharded (ZeRO-3's persistent
  // tensors), all units together.
  double persistent_params() const {
    if (!spec_.shard_parameters) return 0;
    double n = 0;
    for (int k = 0; k < 3; ++k)
      n += (k == 1 ? static_cast<double>(in_.model->layers) : 1.0) *
           (units_[k].params - units_[k].shardable);
    return n;
  }

  // Schedules an op on a stream once `ready`; returns its start. `cause` is the stream whose
  // completion made it ready (for attributing compute idle time).
  double issue(Stream s, double ready, Stream cause, double dur, const char* what, int unit);
  // Records an allocation (bytes > 0) or a free at time t, keeping the timeline in time order
  // (stable: equal times keep the order they were recorded in). Ops are recorded nearly in time
  // order, so the insertion moves an event back by a few places at most.
  void mem(double t, double bytes, Category c, Phase p, int unit, int mb, int gathered = 0) {
    if (bytes == 0 && gathered == 0) return;
    events_.push_back({t, bytes, c, p, static_cast<std::int8_t>(gathered), unit, mb});
    for (std::size_t i = events_.size() - 1; i > 0 && events_[i - 1].t > t; --i)
      std::swap(events_[i - 1], events_[i]);
  }
  double coll(Collective op, const Group& g, double size) {
    // Units repeat: most calls ask for a size already costed.
    CollectiveCost c;
    bool hit = false;
    for (const auto& e : cost_cache_)
      if (e.size == size && e.op == op && e.ranks == g.ranks && e.per_node == g.ranks_per_node) {
        c = e.cost;
        hit = true;
        break;
      }
    if (!hit) {
      c = comm_.cost(op, g, size);
      cost_cache_[cache_next_++ % cost_cache_.size()] = {op, g.ranks, g.ranks_per_node, size, c};
    }
    result_.comm_bytes_per_gpu += c.bytes_sent;
    result_.comm_bytes_by_op[static_cast<int>(op)] += c.bytes_sent;
    result_.calibrated_comm |= c.calibrated;
    result_.extrapolated_comm |= c.extrapolated;
    return c.seconds;
  }
  // Time of a reduction of `bytes` split into buckets of the spec's size.
  double bucketed(Collective op, const Group& g, double bytes, double bucket);
  // Unit u of the step: 0 the embeddings, the last the head, the others blocks (a checkpointed
  // block keeps only its input and reruns its forward).
  const UnitInfo& info(int u) const {
    if (u == 0) return units_[0];
    if (u == n_units_ - 1) return units_[2];
    return checkpointed(u) ? units_[3] : units_[1];
  }
  // DeepSpeed 0.19.8's buffers as its engines allocate them (frameworks only; the executor keeps
  // its own): stage 3's flat gradient partition lives from initialize to the end
  // (deepspeed/runtime/zero/stage3.py, grad_partitions_flat_buffer); stages 1/2 take their reduce
  // bucket at a backward's first gradient and release it at its end (stage_1_and_2.py,
  // setup_buckets and _release_ipg_buffers), stage 3 keeps its bucket from initialize.
  bool persistent_flat_partition() const {
    return frameworks_ && spec_.flat_grad_partition && spec_.offload == Offload::none;
  }
  bool backward_bucket() const {
    return frameworks_ && spec_.contiguous_grad_bucket && !spec_.flat_grad_partition;
  }
  // DeepSpeed ZeRO-1 (frameworks): reduces once the backward is done, in buckets, keeping each
  // rank's partition (stage_1_and_2.py, reduce_gradients at the accumulation boundary).
  bool reduces_after_backward() const {
    return frameworks_ && spec_.flavour == Flavour::deepspeed && spec_.shard_optimizer &&
           !spec_.shard_gradients && spec_.offload == Offload::none;
  }
  // DeepSpeed stages 1/2 (frameworks): the rank's gradient partition is one buffer, allocated
  // whole by the first reduced bucket of a step (stage_1_and_2.py, copy_grads_in_partition) and
  // kept to the step.
  bool whole_partition_buffer() const {
    return frameworks_ && spec_.flavour == Flavour::deepspeed && spec_.shard_optimizer &&
           !spec_.flat_grad_partition && spec_.contiguous_grad_bucket &&
           spec_.offload == Offload::none;
  }
  bool checkpointed(int u) const {
    return u > 0 && u < n_units_ - 1 && in_.job.block_checkpointed(u - 1);
  }
  std::string fail(std::string reason, std::string input) {
    result_.valid = false;
    result_.reason_input = std::move(input);
    result_.reason = std::move(reason);
    return result_.reason;
  }
  bool check_plan();
  // PyTorch DDP's mixed precision is autocast over fp32 parameters: each GEMM casts its weight
  // (kept for backward) and its input.
  bool autocast_copies() const {
    return spec_.flavour == Flavour::ddp && sb_.compute < sb_.param &&
           in_.accounting == Accounting::framework;
  }
  // The step's per-unit sizes and times, the groups, and the cleared timeline.
  void prepare();
  void prepare_bytes();
  void prepare_unit_sizes();
  void prepare_unit_times();
  void prepare_gathers();
  // One micro-batch's forward and backward; `first`: the first of the step (gradients are
  // allocated), `reduce`: its gradients are reduced.
  void micro_batch(int mb, bool first, bool reduce);
  void forward(int mb);
  void backward(int mb, bool first, bool reduce);
  // All-gathers unit u's parameters once `issue_t`; returns when they are ready.
  double gather(int u, double issue_t, Phase phase, int mb);
  // A checkpointed unit's forward again before its backward (from `ready`, waiting on `cause`).
  void rerun_forward(int u, double ready, Stream cause, int mb);
  // Unit g's gradients appear at t: kept whole (DDP, ZeRO-1) they are allocated by the step's
  // first micro-batch and kept to the step; sharded, the unit's full gradient is a transient
  // until it is reduced.
  void gradients_used(int g, double t, int mb, bool first);
  // Unit u's gradients join the pending reduction, reduced once the framework's bucket is full.
  void queue_reduction(int u, double end, int mb, bool first);
  // A block's ring exchange beside its attention (from `start`, the attention's `attention_s`
  // at the end of the unit's `unit_s`): its buffers for the unit's span, its bytes, and the
  // compute stream's wait for it.
  void ring_exchange(int u, double start, double unit_s, double attention_s, bool backward,
                     Phase phase, int mb);
  void reduce_pending(int u, double end, int mb, bool first);
  void walk_memory();

  // The model states before the step starts, on the device and in total.
  struct States {
    double param_bytes = 0, opt_bytes = 0, total_params = 0, local_opt_params = 0;
  };
  // Empty, after fail(), when offloaded states do not fit the host.
  std::optional<States> place_states();
  // What the first of several micro-batches did, to count it gas − 1 times.
  struct FirstMicroBatch {
    double seconds = 0;
    std::array<double, kStreams> busy{}, exposed{};
    double bytes = 0;
    std::array<double, kCollectives> bytes_by_op{};
  };
  FirstMicroBatch run_micro_batches(std::int64_t gas);
  void wait_for_reductions();
  // The optimizer step from t, and the parameter all-gather after it; returns its end.
  double optimizer_step(double t, const States& st);
  double device_optimizer(double t, const States& st);  // on the GPU's memory bandwidth
  double host_optimizer(double t, const States& st);    // on the host's CPUs (offload)
  // ZeRO-3's persistent parameters and ZeRO-1/2's partitions all-gathered once updated.
  double gather_updated_parameters(double t, const States& st);
  void account_states(const States& st);
  void add_overheads();
  void account_compute(std::int64_t gas, const FirstMicroBatch& first);

  const StepInput& in_;
  ShardingSpec spec_;  // the plan, normalized for the accounting mode
  Trace* trace_;
  CommModel comm_;
  // The frameworks' own code runs (as measured: tests/costmodel/data/oracle_*.json), not the ZeRO
  // paper's model states alone nor this project's executor (executor/engine.cpp), whose engine
  // gathers the embeddings and head apart, reduces in place, steps AdamW in place, keeps
  // DeepSpeed's stage-3 gradient partition in fp32 and sizes its reduce buckets in bytes.
  const bool frameworks_;
  StepResult result_;
  StateBytes sb_;
  std::array<UnitInfo, 4> units_;  // embeddings, block, head, checkpointed block
  int n_units_ = 0;
  int world_ = 1, shard_ = 1;  // ranks; shard group size
  Group shard_group_, replica_group_;
  bool hsdp_ = false;
  int fwd_prefetch_ = 1;
  double reduce_b_ = 2, compute_b_ = 2;
  double flat_grad_b_ = 4;  // bytes per element of DeepSpeed ZeRO-3's flat gradient partition
  std::array<double, kStreams> free_at_{};  // when each stream is next free
  std::vector<double> fwd_start_, fwd_end_, bwd_start_, bwd_end_, gathered_free_;
  std::vector<char> gathered_alive_;
  std::vector<MemEvent> events_;  // the memory timeline, in time order
  struct CachedCost {
    Collective op;
    int ranks, per_node;
    double size;
    CollectiveCost cost;
  };
  std::array<CachedCost, 8> cost_cache_{};
  std::size_t cache_next_ = 0;
  double pending_reduce_bytes_ = 0;
  std::vector<int> pending_units_;
  double reduce_input_done_ = 0;   // FSDP2: when the last reduce-scatter input may be released
  bool partition_placed_ = false;  // DeepSpeed stages 1/2: the step's gradient partition exists
  double total_params_ = 0;        // the model's parameters (elements)
  double kept_grad_bytes_ = 0;     // gradients kept until zero_grad at the end of the step
  // Context parallelism: the ranks sharing each sequence, their group, and what a block's ring
  // attention holds and sends (context_ring.hpp).
  int context_ = 1;
  Group context_group_;
  RingAttention ring_;
  // Blocking collectives: the straggler wait's fraction for the world's ranks, and the compute
  // issued since the last collective.
  double straggler_fraction_ = 0;
  double compute_since_collective_ = 0;
};

double Simulation::issue(Stream s, double ready, Stream cause, double dur, const char* what,
                         int unit) {
  // Where collectives block the thread that computes (a CPU profile's MPI): everything is one
  // stream, and each collective first waits for the slowest rank to arrive: the calibrated
  // straggler fraction of the compute since the previous collective (HardwareProfile::
  // straggler_wait_fraction).
  if (in_.hardware->collectives_block && s == Stream::compute) compute_since_collective_ += dur;
  if (in_.hardware->collectives_block && s != Stream::compute) {
    if (dur > 0) {
      const double wait = straggler_fraction_ * compute_since_collective_;
      compute_since_collective_ = 0;
      result_.straggler_wait_s += wait;
      dur += wait;
    }
    const double start = std::max(free_at_[0], ready);
    free_at_[0] = start + dur;
    free_at_[static_cast<int>(s)] = free_at_[0];
    result_.busy_s[static_cast<int>(s)] += dur;
    result_.exposed_s[static_cast<int>(s)] += dur;
    if (trace_ && dur > 0)
      trace_->spans.push_back(
          {s, unit >= 0 ? fmt::format("{} {}", what, unit_label(unit, n_units_)) : what, start, dur,
           unit});
    return start;
  }
  auto& free = free_at_[static_cast<int>(s)];
  const double start = std::max(free, ready);
  if (s == Stream::compute && ready > free)
    result_.exposed_s[static_cast<int>(cause)] += ready - free;
  free = start + dur;
  result_.busy_s[static_cast<int>(s)] += dur;
  if (trace_ && dur > 0)
    trace_->spans.push_back(
        {s, unit >= 0 ? fmt::format("{} {}", what, unit_label(unit, n_units_)) : what, start, dur,
         unit});
  return start;
}

double Simulation::bucketed(Collective op, const Group& g, double bytes, double bucket) {
  if (bytes <= 0) return 0;
  if (bucket <= 0 || bucket >= bytes) return coll(op, g, bytes);
  const double full = std::floor(bytes / bucket);
  const double rest = bytes - full * bucket;
  double t = 0;
  // One collective per full bucket and one for the remainder (DDP's bucket_cap_mb semantics).
  const double before = result_.comm_bytes_per_gpu;
  const double before_op = result_.comm_bytes_by_op[static_cast<int>(op)];
  const double one = coll(op, g, bucket);
  result_.comm_bytes_per_gpu = before + (result_.comm_bytes_per_gpu - before) * full;
  result_.comm_bytes_by_op[static_cast<int>(op)] =
      before_op + (result_.comm_bytes_by_op[static_cast<int>(op)] - before_op) * full;
  t += one * full;
  if (rest > 0) t += coll(op, g, rest);
  return t;
}

bool Simulation::check_plan() {
  const auto& c = in_.cluster;
  const auto& s = spec_;
  const auto& j = in_.job;
  world_ = c.gpus;
  shard_ = s.group(world_);
  hsdp_ = shard_ < world_;
  if (shard_ > world_ || world_ % shard_ != 0) {
    fail(fmt::format("shard group of {} does not divide {} GPUs", shard_, world_),
         "--shard-group-size");
    return false;
  }
  if (j.micro_batch <= 0 || j.global_batch % world_ != 0 ||
      (j.global_batch / world_) % j.micro_batch != 0) {
    fail(fmt::format(
             "micro-batch {} does not divide the per-GPU batch of global batch {} on {} GPUs",
             j.micro_batch, j.global_batch, world_),
         "--micro-batch");
    return false;
  }
  if (s.offload != Offload::none && !s.shard_optimizer) {
    fail(fmt::format("{} cannot offload: offload needs sharded optimizer states (ZeRO or FSDP)",
                     s.strategy),
         "--offload");
    return false;
  }
  if (s.offload == Offload::params && !s.shard_parameters) {
    fail(fmt::format(
             "{} cannot offload parameters: they are not sharded (zero3, fsdp-full, hsdp can)",
             s.strategy),
         "--offload");
    return false;
  }
  if (s.offload == Offload::optimizer &&
      (s.flavour == Flavour::fsdp1 || s.flavour == Flavour::fsdp2)) {
    fail("FSDP offloads parameters, gradients and optimizer together (CPUOffload); use offload "
         "params",
         "--offload");
    return false;
  }
  return true;
}

void Simulation::prepare() {
  prepare_bytes();
  prepare_unit_sizes();
  prepare_unit_times();
  prepare_gathers();
}

// Bytes per element of the states, the compute dtype and the reduction.
void Simulation::prepare_bytes() {
  const auto& j = in_.job;
  const auto& s = spec_;
  const bool paper = in_.accounting == Accounting::zero_paper;
  sb_ = state_bytes(j.precision, s, in_.accounting);
  // DeepSpeed 0.19.8's stage-3 gradient partition (grad_partitions_flat_buffer) is in the
  // gradients' dtype, not fp32.
  flat_grad_b_ = frameworks_ ? sb_.grad : 4.0;
  if (frameworks_ && s.separate_fp32_master && sb_.master == 0 && j.precision == Precision::fp32) {
    // DeepSpeed clones each rank's share into an fp32 master partition in fp32 jobs too
    // (single_partition_of_fp32_groups, fp32_partitioned_groups_flat) and steps on an fp32 copy
    // of the gradient partition.
    sb_.master = 4;
    sb_.step_grad = 4;
  }
  compute_b_ = sb_.compute;
  // Gradients are reduced in the spec's dtype, but never below the dtype they are computed in
  // (an fp32 job's FSDP/DeepSpeed defaults of bf16 reduction do not apply: its param dtype is
  // fp32).
  reduce_b_ = paper ? 2.0 : std::max(dtype_bytes(s.reduce_dtype), sb_.compute);
  n_units_ = static_cast<int>(in_.model->layers) + 2;
}

// Elements of each unit kind: parameters, the shardable and gathered ones, GEMM weights and
// optimizer states.
void Simulation::prepare_unit_sizes() {
  const auto& m = *in_.model;
  const auto& j = in_.job;
  const auto& s = spec_;
  const std::int64_t threshold =
      in_.accounting == Accounting::zero_paper ? 0 : s.persistence_threshold;
  const UnitTensors* tensors[3] = {&m.embedding, &m.block, &m.head};
  for (int k = 0; k < 3; ++k) {
    auto& u = units_[k];
    const auto& t = *tensors[k];
    u.params = static_cast<double>(t.params());
    // The frameworks keep each small tensor whole; the executor a unit whose tensors are all
    // small (executor/shard_layout.hpp).
    const std::int64_t persistent =
        frameworks_ ? persistent_elements(t, threshold) : persistent_unit_elements(t, threshold);
    u.shardable = s.shard_parameters ? u.params - static_cast<double>(persistent) : u.params;
    u.gather = s.shard_parameters ? u.shardable : 0;
    u.matmul = static_cast<double>(t.matmul_params());
    u.opt_elems = static_cast<double>(optimizer_state_elements(t, j.optimizer));
  }
  // The head re-gathers the shared embedding matrix, unless that stays whole (persistent).
  const double tied =
      m.tied_embeddings ? static_cast<double>(m.embedding.tensors.front().elements()) : 0.0;
  const bool tied_sharded =
      frameworks_ ? tied >= static_cast<double>(threshold) : units_[0].shardable > 0;
  if (s.shard_parameters && tied > 0 && tied_sharded) units_[2].gather += tied;
  if (m.tied_embeddings)
    units_[2].matmul += static_cast<double>(m.embedding.tensors.front().elements());
  units_[0].matmul = 0;                     // an embedding lookup is a gather, not a GEMM
  if (s.root_unit && s.shard_parameters) {  // the root gathers the head's parameters with its own
    units_[0].gather +=
        units_[2].gather -
        (m.tied_embeddings ? static_cast<double>(m.embedding.tensors.front().elements()) : 0.0);
    units_[2].gather = 0;
  }
}

// Each unit kind's FLOPs, compute times by kind, recompute and activations.
void Simulation::prepare_unit_times() {
  const auto& m = *in_.model;
  const auto& j = in_.job;
  const auto& s = spec_;
  const auto& hw = *in_.hardware;
  const double tokens = static_cast<double>(j.seq_len * j.micro_batch);
  const UnitTensors* tensors[3] = {&m.embedding, &m.block, &m.head};
  // The attention's FLOPs per token grow with the keys it meets: the whole sequence.
  units_[1].fwd_flops = block_forward_flops_per_token(m, j.seq_len * context_) * tokens;
  units_[2].fwd_flops = head_forward_flops_per_token(m) * tokens;
  // Each unit's kernels by kind (costmodel/compute_time.hpp), and the host's work to issue them:
  // a GPU runs a unit at the slower of the two (kernels queue behind the host), a CPU rank does
  // both in turn. The executor's own engine has no framework hooks or eager dispatch.
  // The parameters the forward reads: fp32 under DDP's autocast, the gathered or kept 16-bit
  // copies under FSDP and DeepSpeed (and the compute dtype when there is one dtype).
  const Forward f{compute_b_, autocast_copies() ? sb_.param : compute_b_, !hw.is_cpu};
  const ComputeModel cm(hw, j);
  const UnitKind unit_kinds[3] = {UnitKind::embedding, UnitKind::block, UnitKind::head};
  // DeepSpeed hooks every submodule only at stage 3 (it gathers parameters there).
  const char* framework_key = s.flavour != Flavour::deepspeed ? flavour_name(s.flavour)
                              : s.shard_parameters            ? "deepspeed_zero3"
                                                              : "deepspeed_zero12";
  for (int k = 0; k < 3; ++k) {
    auto& u = units_[k];
    const UnitWork w = unit_work(cm, m, j, unit_kinds[k], f, k == 1 ? context_ : 1);
    HostWork h;
    if (frameworks_) {
      const auto& t = tensors[k]->tensors;
      const auto linears =
          std::count_if(t.begin(), t.end(), [](const Tensor& x) { return x.is_matrix(); });
      h = unit_host_work(hw, framework_key, w, static_cast<double>(t.size()),
                         static_cast<double>(linears));
    }
    auto run = [&](const ComputeTimes& device, double host, ComputeTimes& kinds) {
      const double dev = std::accumulate(device.begin(), device.end(), 0.0);
      const double t = hw.is_cpu ? dev + host : std::max(dev, host);
      for (int c = 0; c < kComputeKinds; ++c) kinds[c] += device[c];
      kinds[static_cast<int>(ComputeKind::host_overhead)] += t - dev;
      return t;
    };
    u.kinds = {};
    u.fwd_kinds = {};
    u.fwd_s = run(w.forward, h.forward_s, u.fwd_kinds);
    u.bwd_s = run(w.backward, h.backward_s, u.kinds);
    for (int c = 0; c < kComputeKinds; ++c) u.kinds[c] += u.fwd_kinds[c];
  }
  // Recompute: a checkpointed block reruns its forward; Megatron's selective recompute reruns the
  // eager attention core; torchtitan's op-level policy reruns what its save list drops.
  units_[3] = units_[1];
  units_[3].recompute_s = units_[1].fwd_s;
  if (counts_recipe_traffic(j)) {
    // A recipe's rerun skips what its checkpoint's early stop leaves out (traffic.hpp).
    const double skipped = block_traffic(m, j, f).forward - recompute_traffic(m, j, f).forward;
    units_[3].recompute_s -= std::min(
        cm.traffic_s(skipped), units_[1].fwd_kinds[static_cast<int>(ComputeKind::memory_bound)]);
  }
  const ComputeTimes selective = block_recompute(cm, m, j, f);
  units_[1].recompute_s = std::accumulate(selective.begin(), selective.end(), 0.0);
  units_[0].act = embedding_activations(m, j, f);
  units_[1].act = block_activations(m, j, f, false);
  units_[3].act = block_activations(m, j, f, true);
  units_[2].act = head_activations(m, j, f);
  ring_ = ring_attention(m, j, context_);
  // Mesh order dp, cp (tensor parallelism 1): the ring's ranks are neighbours.
  context_group_ = {context_, std::min(context_, in_.cluster.gpus_per_node)};
}

// The shard and replica groups, the forward prefetch, each unit kind's all-gather, and the
// cleared timeline.
void Simulation::prepare_gathers() {
  const auto& s = spec_;
  const auto& hw = *in_.hardware;
  const int G = in_.cluster.gpus_per_node;
  shard_group_ = {shard_, std::min(shard_, G)};
  replica_group_ = {world_ / shard_, std::max(1, G / shard_)};
  fwd_prefetch_ = s.forward_prefetch;
  if (s.prefetch_bucket_elems > 0 && units_[1].gather > 0)
    fwd_prefetch_ = std::max(1, static_cast<int>(s.prefetch_bucket_elems / units_[1].gather));

  // Every unit of a kind gathers the same bytes: cost the all-gather once per kind.
  for (auto& u : units_) {
    u.gather_bytes = u.gather * compute_b_;
    if (u.gather_bytes <= 0) continue;
    const auto c = comm_.cost(Collective::all_gather, shard_group_, u.gather_bytes);
    u.gather_s = c.seconds;
    u.gather_sent = c.bytes_sent;
    result_.calibrated_comm |= c.calibrated;
    result_.extrapolated_comm |= c.extrapolated;
    if (s.offload == Offload::params)
      u.gather_s += u.shardable / shard_ * compute_b_ / hw.host_link_Bps;
  }
  const auto n = static_cast<std::size_t>(n_units_);
  fwd_start_.assign(n, 0);
  fwd_end_.assign(n, 0);
  bwd_start_.assign(n, 0);
  bwd_end_.assign(n, 0);
  gathered_free_.assign(n, 0);
  gathered_alive_.assign(n, 0);
  events_.clear();
  events_.reserve(n * 12);
  for (auto& e : cost_cache_) e.size = -1;
}

void Simulation::micro_batch(int mb, bool first, bool reduce) {
  forward(mb);
  backward(mb, first, reduce);
}

double Simulation::gather(int u, double issue_t, Phase phase, int mb) {
  const auto& ui = info(u);
  const double dur = ui.gather_s;
  result_.comm_bytes_per_gpu += ui.gather_sent;
  result_.comm_bytes_by_op[static_cast<int>(Collective::all_gather)] += ui.gather_sent;
  const double st = issue(Stream::all_gather, issue_t, Stream::compute, dur, "all-gather", u);
  mem(st, ui.gather_bytes, Category::buffers, phase, u, mb, +1);
  gathered_alive_[u] = 1;
  return st + dur;
}

void Simulation::forward(int mb) {
  const auto& s = spec_;
  const int U = n_units_;
  const bool autocast_copies = this->autocast_copies();
  // The last unit is used again at once by backward: FSDP2's root and FSDP1's root keep it, and
  // DeepSpeed's trace-based prefetch finds it still gathered.
  // DeepSpeed ZeRO-3 does not release a module's parameters when the parameters its trace uses
  // before their next use number fewer than stage3_max_reuse_distance
  // (deepspeed/runtime/zero/partitioned_param_coordinator.py, __params_to_release). For unit u
  // after its forward, that is the forward and the backward of every later unit and of the part
  // of u after the parameter: about 2·(after_u + P_u − prefix) elements for a parameter whose
  // unit's preceding parameters number `prefix`, so the first R/2 − after_u elements of u stay.
  // DeepSpeed decides parameter by parameter; the walk keeps a unit whole when most of it stays.
  std::vector<double> after(static_cast<std::size_t>(U) + 1, 0.0);
  for (int u = U - 1; u >= 0; --u) after[u] = after[u + 1] + info(u).params;
  const double R = frameworks_ ? s.reuse_distance_elems : 0;
  auto kept_through_backward = [&](int u) {
    if (!s.reshard_after_forward) return true;
    if (in_.accounting == Accounting::zero_paper) return false;
    if (u == U - 1) return true;
    if (R > 0 && R / 2 - after[u + 1] >= info(u).params / 2) return true;
    return (s.keep_root_unsharded || s.root_unit) && u == 0;
  };

  double cached_casts = 0;  // bytes of checkpointed blocks' weight casts in autocast's cache
  for (int u = 0; u < U; ++u) {
    const auto& ui = info(u);
    double ready = 0;
    Stream cause = Stream::compute;
    if (s.shard_parameters && ui.gather > 0 && !gathered_alive_[u]) {
      // Issue: when the CPU reaches this unit's pre-forward, `prefetch` units ahead of the GPU;
      // rate limit: the gathered unit `limit` positions back must be freed.
      const int fp = fwd_prefetch_;
      double issue_t = u - fp >= 0 ? (fp == 0 ? fwd_end_[u - 1] : fwd_start_[u - fp]) : 0;
      if (fp == 0 && u == 0) issue_t = free_at_[0];
      if (s.reshard_after_forward && u - s.max_inflight_allgathers >= 0)
        issue_t = std::max(issue_t, gathered_free_[u - s.max_inflight_allgathers]);
      ready = gather(u, issue_t, Phase::forward, mb);
      cause = Stream::all_gather;
    }
    const double st = issue(Stream::compute, ready, cause, ui.fwd_s, "forward", u);
    fwd_start_[u] = st;
    fwd_end_[u] = st + ui.fwd_s;
    if (context_ > 1 && u > 0 && u < U - 1)
      ring_exchange(u, st, ui.fwd_s, ui.fwd_kinds[static_cast<int>(ComputeKind::attention)], false,
                    Phase::forward, mb);
    mem(st, ui.act.saved + ui.act.forward, Category::activations, Phase::forward, u, mb);
    mem(fwd_end_[u], -ui.act.forward, Category::activations, Phase::forward, u, mb);
    // autocast's casts of the weights are tensors autograd keeps, like the activations; a
    // checkpointed block keeps none, and its casts live in autocast's cache until the forward's
    // autocast region ends with the loss (torch/csrc/autograd/autocast_mode.cpp, cached_cast and
    // clear_cache on leaving the outermost region).
    if (autocast_copies) {
      mem(st, ui.matmul * compute_b_, Category::activations, Phase::forward, u, mb);
      cached_casts += checkpointed(u) ? ui.matmul * compute_b_ : 0;
    }
    if (s.shard_parameters && gathered_alive_[u] && !kept_through_backward(u)) {
      mem(fwd_end_[u], -ui.gather_bytes, Category::buffers, Phase::forward, u, mb, -1);
      gathered_alive_[u] = 0;
      gathered_free_[u] = fwd_end_[u];
    }
  }
  if (cached_casts > 0)
    mem(fwd_end_[U - 1], -cached_casts, Category::activations, Phase::forward, U - 1, mb);
}

void Simulation::backward(int mb, bool first, bool reduce) {
  const auto& s = spec_;
  const int U = n_units_;
  const bool shard_params = s.shard_parameters;
  const bool autocast_copies = this->autocast_copies();
  pending_reduce_bytes_ = 0;
  pending_units_.clear();
  for (int u = U - 1; u >= 0; --u) {
    const auto& ui = info(u);
    double ready = 0;
    Stream cause = Stream::compute;
    if (shard_params && ui.gather > 0 && !gathered_alive_[u]) {
      const int bp = s.backward_prefetch;
      double issue_t = u + bp <= U - 1 ? (bp == 0 ? bwd_end_[u + 1] : bwd_start_[u + bp]) : 0;
      if (u + s.max_inflight_allgathers <= U - 1)
        issue_t = std::max(issue_t, bwd_end_[u + s.max_inflight_allgathers]);
      ready = gather(u, issue_t, Phase::backward, mb);
      cause = Stream::all_gather;
    }
    if (ui.recompute_s > 0) {
      rerun_forward(u, ready, cause, mb);
      ready = 0;
    }
    const double st = issue(Stream::compute, ready, cause, ui.bwd_s, "backward", u);
    bwd_start_[u] = st;
    const double end = st + ui.bwd_s;
    bwd_end_[u] = end;
    if (context_ > 1 && u > 0 && u < U - 1)
      ring_exchange(u, st, ui.bwd_s,
                    ui.kinds[static_cast<int>(ComputeKind::attention)] -
                        ui.fwd_kinds[static_cast<int>(ComputeKind::attention)],
                    true, Phase::backward, mb);
    // The unit's backward kernels run after its pre-backward hooks, which issue the next unit's
    // all-gather (FSDP's backward prefetch, recorded at `st`): a moment later.
    const double kernels = st + 1e-3 * ui.bwd_s;
    mem(kernels, ui.act.backward, Category::activations, Phase::backward, u, mb);
    // The loss's backward runs first and releases its transient and what it kept; the
    // projection's gradients come after.
    if (ui.act.loss > 0)
      mem(kernels, -(ui.act.backward + ui.act.loss), Category::activations, Phase::backward, u, mb);
    // Gradients: kept whole (DDP, ZeRO-1) they are allocated on first use and kept to the step;
    // sharded, the unit's full gradient is a transient until it is reduced. A tied head's backward
    // adds into the embedding matrix's gradient, so the embedding unit's gradient is first used
    // there, not at the embedding's own backward (autograd accumulates into the shared weight's
    // .grad from its first use; a flat parameter holds one gradient for the whole unit).
    const double fresh = s.shard_gradients ? ui.params * compute_b_ : 0;
    const bool tied = in_.model->tied_embeddings;
    if (!(tied && u == 0)) gradients_used(u, kernels, mb, first);
    if (tied && u == U - 1) gradients_used(0, kernels, mb, first);
    const double released =
        ui.act.loss > 0 ? ui.act.saved - ui.act.loss : ui.act.saved + ui.act.backward;
    mem(end, -(released + ui.act.recompute), Category::activations, Phase::backward, u, mb);
    if (autocast_copies)
      mem(end, -ui.matmul * compute_b_, Category::activations, Phase::backward, u, mb);
    if (shard_params && gathered_alive_[u]) {
      mem(end, -ui.gather_bytes, Category::buffers, Phase::backward, u, mb, -1);
      gathered_alive_[u] = 0;
    }
    if (s.contiguous_grad_bucket && fresh > 0)
      mem(end, -fresh, Category::gradients, Phase::backward, u, mb);
    if (backward_bucket() && u == U - 1)
      mem(end, s.reduce_bucket_bytes, Category::buffers, Phase::backward, u, mb);
    if (reduce) queue_reduction(u, end, mb, first);
  }
  // The bucket goes when the backward's reductions are done (reduce_pending), or at its end.
  if (backward_bucket() && !reduce)
    mem(bwd_end_[0], -s.reduce_bucket_bytes, Category::buffers, Phase::backward, 0, mb);
}

void Simulation::rerun_forward(int u, double ready, Stream cause, int mb) {
  const auto& ui = info(u);
  const double st = issue(Stream::compute, ready, cause, ui.recompute_s, "recompute", u);
  mem(st, ui.act.recompute, Category::activations, Phase::recompute, u, mb);
  if (context_ > 1 && checkpointed(u))  // the rerun forward runs the ring again
    ring_exchange(u, st, ui.recompute_s, ui.fwd_kinds[static_cast<int>(ComputeKind::attention)],
                  false, Phase::recompute, mb);
  // The recompute runs under the forward's autocast state again (torch/utils/checkpoint.py
  // restores it), and the GEMMs keep their weight casts for the backward.
  if (autocast_copies())
    mem(st, ui.matmul * compute_b_, Category::activations, Phase::recompute, u, mb);
}

void Simulation::gradients_used(int g, double t, int mb, bool first) {
  const auto& s = spec_;
  const double elems = info(g).params;
  if (!s.shard_gradients && first) {
    mem(t, elems * sb_.grad, Category::gradients, Phase::backward, g, mb);
    kept_grad_bytes_ += elems * sb_.grad;
  }
  if (s.shard_gradients) mem(t, elems * compute_b_, Category::gradients, Phase::backward, g, mb);
}

// Reduction: per unit, or when the framework's bucket has filled.
void Simulation::queue_reduction(int u, double end, int mb, bool first) {
  const auto& s = spec_;
  const int U = n_units_;
  if (s.root_unit && s.shard_gradients && u == U - 1) return;  // reduced with the root, below
  pending_reduce_bytes_ += info(u).params * reduce_b_;
  pending_units_.push_back(u);
  if (s.root_unit && s.shard_gradients && u == 0) {
    pending_reduce_bytes_ += info(U - 1).params * reduce_b_;
    pending_units_.push_back(U - 1);
  }
  const bool per_unit_buckets =
      !s.contiguous_grad_bucket;  // DDP caps buckets; FSDP reduces per unit
  if (!per_unit_buckets && pending_reduce_bytes_ < s.reduce_bucket_bytes && u > 0) return;
  if (reduces_after_backward() && u > 0) return;
  reduce_pending(u, end, mb, first);
}

// Reduces the pending gradients once unit u's backward ends: reduce-scatter or all-reduce, then
// HSDP's replica all-reduce and the offload's copy to the host; frees the unsharded gradients and
// keeps the shards.
void Simulation::reduce_pending(int u, double end, int mb, bool first) {
  const auto& s = spec_;
  const double S = shard_;
  const bool offload_opt = s.offload != Offload::none;
  const double bucket = s.reduce_bucket_bytes;
  const bool per_unit_buckets = !s.contiguous_grad_bucket;
  // DeepSpeed's stages 1/2 all-reduce the bucket and keep their partition of it.
  const Collective op = s.shard_optimizer && !s.all_reduce_partitions ? Collective::reduce_scatter
                                                                      : Collective::all_reduce;
  const Stream rs_stream =
      op == Collective::reduce_scatter ? Stream::reduce_scatter : Stream::all_reduce;
  const double dur = per_unit_buckets ? bucketed(op, shard_group_, pending_reduce_bytes_, bucket)
                                      : coll(op, shard_group_, pending_reduce_bytes_);
  const bool copy_in = s.reduce_copy_in && s.shard_gradients;
  if (copy_in) {
    // FSDP2 keeps at most reduce_scatter_max_input_buffers (default 1) reduce-scatter inputs: the
    // compute stream waits for the previous reduce-scatter before the next copy-in
    // (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, post_backward: the oldest
    // reduce_scatter_states entry's event).
    end = issue(Stream::compute, reduce_input_done_, rs_stream, 0.0, "wait for reduce-scatter", u);
  }
  const double rs = issue(rs_stream, end, Stream::compute, dur,
                          op == Collective::reduce_scatter ? "reduce-scatter" : "all-reduce", u);
  double done = rs + dur;  // when this bucket's gradients are fully reduced
  if (copy_in) {
    // The unsharded gradients move into the flat reduce-scatter input; the output shard, in the
    // reduce dtype, is then added into the kept gradient.
    reduce_input_done_ = rs + dur;
    mem(end, pending_reduce_bytes_, Category::buffers, Phase::reduce, u, mb);
    mem(rs, pending_reduce_bytes_ / S, Category::buffers, Phase::reduce, u, mb);
    mem(rs + dur, -pending_reduce_bytes_ * (1 + 1 / S), Category::buffers, Phase::reduce, u, mb);
  }
  if (hsdp_ && s.shard_gradients) {  // HYBRID_SHARD: all-reduce the shard across replicas
    const double ar = coll(Collective::all_reduce, replica_group_, pending_reduce_bytes_ / S);
    done =
        issue(Stream::all_reduce, done, Stream::reduce_scatter, ar, "replica all-reduce", u) + ar;
  }
  if (offload_opt && s.shard_gradients) {  // gradient partitions stream to host memory
    const double d2h = pending_reduce_bytes_ / S / in_.hardware->host_link_Bps;
    done = issue(Stream::host, done, Stream::reduce_scatter, d2h, "gradients to host", u) + d2h;
  }
  // (ZeRO-1 under accumulation reduces in the last micro-batch only, not the first.)
  if (whole_partition_buffer() && !partition_placed_) {
    const double partition = total_params_ / S * sb_.grad;
    mem(rs, partition, Category::gradients, Phase::reduce, u, mb);
    kept_grad_bytes_ += partition;
    partition_placed_ = true;
  }
  for (int pu : pending_units_) {
    const auto& pi = info(pu);
    // ZeRO-1's whole gradients are removed as their bucket is reduced.
    if (reduces_after_backward()) {
      mem(rs + dur, -pi.params * sb_.grad, Category::gradients, Phase::reduce, pu, mb);
      kept_grad_bytes_ -= pi.params * sb_.grad;
    }
    if (s.shard_gradients && !s.contiguous_grad_bucket)
      mem(copy_in ? end : rs + dur, -pi.params * compute_b_, Category::gradients, Phase::reduce, pu,
          mb);
    if (s.shard_gradients && first && !offload_opt && !persistent_flat_partition() &&
        !whole_partition_buffer()) {
      const double shard = pi.params / S * (s.flat_grad_partition ? flat_grad_b_ : sb_.grad);
      mem(rs + dur, shard, Category::gradients, Phase::reduce, pu, mb);
      kept_grad_bytes_ += shard;
    }
  }
  // The backward's last reduction done, its bucket is released (_release_ipg_buffers).
  if (backward_bucket() && u == 0)
    mem(rs + dur, -s.reduce_bucket_bytes, Category::buffers, Phase::reduce, u, mb);
  pending_reduce_bytes_ = 0;
  pending_units_.clear();
}

void Simulation::ring_exchange(int u, double start, double unit_s, double attention_s,
                               bool backward, Phase phase, int mb) {
  const double held = backward ? ring_.backward_bytes : ring_.forward_bytes;
  const double keys = backward ? ring_.backward_gathered_sent : ring_.forward_gathered_sent;
  const double grads = (backward ? ring_.backward_sent : ring_.forward_sent) - keys;
  // Costed as the collectives that send the same bytes per rank: the keys' and values' gather
  // (a ring all-gather is c − 1 steps of the chunk) and the gradients' passes (all-to-all).
  const double per_size = static_cast<double>(context_) / (context_ - 1);
  double dur = coll(Collective::all_gather, context_group_, keys * per_size);
  if (grads > 0) dur += coll(Collective::all_to_all, context_group_, grads * per_size);
  // The exchange runs beside the attention, which needs what it brings: the unit waits for it
  // past the attention's end (the attention taken last in the unit).
  const double at = issue(Stream::context, start + unit_s - attention_s, Stream::compute, dur,
                          "ring exchange", u);
  issue(Stream::compute, at + dur, Stream::context, 0.0, "wait for the ring", u);
  mem(start, held, Category::buffers, phase, u, mb);
  mem(start + unit_s, -held, Category::buffers, phase, u, mb);
}

void Simulation::walk_memory() {
  Breakdown cur{};
  double cur_total = 0;
  int gathered = 0;
  double peak = -1;
  const MemEvent* at = nullptr;
  int gathered_at_peak = 0;
  double head_act = 0;
  for (const MemEvent& e : events_) {
    cur[static_cast<int>(e.cat)] += e.bytes;
    cur_total += e.bytes;
    if (e.cat == Category::activations && e.unit == n_units_ - 1) head_act += e.bytes;
    gathered += e.gathered;
    if (trace_) trace_->memory.push_back({e.t, cur_total});
    if (cur_total > peak) {
      peak = cur_total;
      result_.at_peak = cur;
      result_.head_activations_at_peak = head_act;
      at = &e;
      gathered_at_peak = gathered;
    }
  }
  result_.allocated_peak_bytes = std::max(peak, 0.0);
  if (at) {
    // Name the op that allocates at the peak: of the events at the peak's instant (a prefetch is
    // often issued at the moment another op allocates), the largest allocation.
    const MemEvent* op = at;
    for (const MemEvent* e = at; e >= events_.data() && e->t == at->t; --e)
      if (e->bytes > op->bytes) op = e;
    const auto& s = spec_;
    std::string when;
    if (op->phase == Phase::setup || op->phase == Phase::optimizer || op->phase == Phase::gather)
      when = phase_name(op->phase);
    else if (op->gathered > 0)
      when = fmt::format("all-gather of {}'s parameters, issued in {}",
                         unit_label(op->unit, n_units_), phase_name(op->phase));
    else if (op->cat == Category::activations && op->unit == n_units_ - 1 &&
             op->phase == Phase::backward)
      when = "backward of the loss: logits gradients";
    else
      when = fmt::format("{} of {}", phase_name(op->phase), unit_label(op->unit, n_units_));
    if (result_.grad_accumulation > 1 && op->phase != Phase::optimizer &&
        op->phase != Phase::gather)
      when += op->micro_batch == 0 ? " (first micro-batch)" : " (last micro-batch)";
    if (s.shard_parameters)
      when += fmt::format(", {} gathered unit{} alive", gathered_at_peak,
                          gathered_at_peak == 1 ? "" : "s");
    result_.peak_when = when;
  }
}

std::optional<Simulation::States> Simulation::place_states() {
  const auto& m = *in_.model;
  const auto& hw = *in_.hardware;
  const auto& s = spec_;
  const double S = shard_;
  States st;
  for (int k = 0; k < 3; ++k) {
    const double count = k == 1 ? static_cast<double>(m.layers) : 1.0;
    const auto& u = units_[k];
    const double whole = u.params - (s.shard_parameters ? u.shardable : 0);
    const double sharded = s.shard_parameters ? u.shardable / S : 0;
    st.param_bytes += count * sb_.param * (whole + (s.offload == Offload::params ? 0 : sharded));
    const double opt_div = s.shard_optimizer ? S : 1.0;
    st.opt_bytes += count * (sb_.master * u.params + sb_.moment * u.opt_elems) / opt_div;
    st.total_params += count * u.params;
    st.local_opt_params += count * u.params / opt_div;
  }
  total_params_ = st.total_params;
  if (s.offload != Offload::none) {
    // Host memory: the node's CPUs hold every local GPU's offloaded optimizer states (fp32
    // master and moments), its fp32 gradient partition, and with parameter offload the sharded
    // parameters, all pinned (DeepSpeed's offload_optimizer/offload_param with pin_memory; FSDP's
    // CPUOffloadPolicy(pin_memory=True)).
    double host_per_gpu = st.opt_bytes + st.local_opt_params * 4.0;
    if (s.offload == Offload::params) host_per_gpu += st.local_opt_params * sb_.param;
    const int gpus_on_node = std::min(in_.cluster.gpus, in_.cluster.gpus_per_node);
    result_.host_bytes_per_node = host_per_gpu * gpus_on_node;
    if (result_.host_bytes_per_node > hw.host_memory_bytes) {
      fail(
          fmt::format(
              "offload needs {:.1f} GiB of host memory per node ({} GPUs x {:.1f} GiB of optimizer "
              "states, gradients{}), the node has {:.1f} GiB",
              result_.host_bytes_per_node / 1073741824.0, gpus_on_node, host_per_gpu / 1073741824.0,
              s.offload == Offload::params ? " and parameters" : "",
              hw.host_memory_bytes / 1073741824.0),
          "--offload");
      return std::nullopt;
    }
    st.opt_bytes = 0;
  }
  mem(0, st.param_bytes, Category::parameters, Phase::setup, -1, 0);
  mem(0, st.opt_bytes, Category::optimizer_states, Phase::setup, -1, 0);
  if (s.grad_bucket_copy && in_.accounting == Accounting::framework)
    mem(0, st.total_params * sb_.grad, Category::buffers, Phase::setup, -1, 0);
  if (persistent_flat_partition())
    mem(0, st.total_params / shard_ * flat_grad_b_, Category::gradients, Phase::setup, -1, 0);
  if (s.contiguous_grad_bucket && in_.accounting == Accounting::framework && !backward_bucket()) {
    // The spec's bucket is in bytes: DeepSpeed's reduce_bucket_size elements of the reduce
    // dtype, sized where the plan is made (planner's with_job_precision, the DeepSpeed import;
    // deepspeed/runtime/zero/stage_1_and_2.py, ipg_buckets). DeepSpeed 0.19.8 keeps one bucket
    // per dtype in every stage (measured: tests/costmodel/data/oracle_deepspeed.json), and so
    // does the executor.
    mem(0, s.reduce_bucket_bytes, Category::buffers, Phase::setup, -1, 0);
  }
  return st;
}

// The first micro-batch (accumulating, no sync for DDP/ZeRO-1) stands for all but the last; the
// last reduces. Time of the middle ones = time of the first.
Simulation::FirstMicroBatch Simulation::run_micro_batches(std::int64_t gas) {
  FirstMicroBatch first;
  if (gas > 1) {
    micro_batch(0, true, spec_.shard_gradients);
    // A micro-batch that reduces ends when its reductions do: FSDP's finalize_backward and
    // DeepSpeed's gradient epilogue wait for them before the next forward
    // (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, _root_post_backward_final_callback;
    // deepspeed/runtime/zero/stage_1_and_2.py, independent_gradient_partition_epilogue), so the
    // wait is the compute stream's, and exposed.
    if (spec_.shard_gradients) wait_for_reductions();
    first.seconds = *std::max_element(free_at_.begin(), free_at_.end());
    first.busy = result_.busy_s;
    first.exposed = result_.exposed_s;
    first.bytes = result_.comm_bytes_per_gpu;
    first.bytes_by_op = result_.comm_bytes_by_op;
    micro_batch(1, false, true);
  } else {
    micro_batch(0, true, true);
  }
  return first;
}

// Waiting for the last reductions before the step is exposed communication.
void Simulation::wait_for_reductions() {
  double last_comm = 0;
  Stream cause = Stream::reduce_scatter;
  for (int k = 1; k < kStreams; ++k)
    if (free_at_[k] > last_comm) {
      last_comm = free_at_[k];
      cause = static_cast<Stream>(k);
    }
  if (last_comm > free_at_[0]) {
    result_.exposed_s[static_cast<int>(cause)] += last_comm - free_at_[0];
    free_at_[0] = last_comm;
  }
}

// Bandwidth-bound over the local shard (read gradient, read and write master and moments, write
// parameters), or on the host when offloaded.
double Simulation::optimizer_step(double t, const States& states) {
  t = spec_.offload == Offload::none ? device_optimizer(t, states) : host_optimizer(t, states);
  return gather_updated_parameters(t, states);
}

double Simulation::device_optimizer(double t, const States& states) {
  const auto& m = *in_.model;
  const auto& hw = *in_.hardware;
  const auto& j = in_.job;
  const auto& s = spec_;
  const double S = shard_;
  const double local_opt_params = states.local_opt_params;
  double opt_elems_local = 0;
  for (int k = 0; k < 3; ++k)
    opt_elems_local += (k == 1 ? static_cast<double>(m.layers) : 1.0) * units_[k].opt_elems /
                       (s.shard_optimizer ? S : 1.0);
  // DeepSpeed stages 1/2 flatten the partition's gradients into a new tensor of their dtype and
  // cast that to fp32 (stage_1_and_2.py, step: flatten(averaged_gradients).to(fp32)), so in a
  // mixed-precision job both copies are alive at once; stage 3 casts its flat partition as it
  // is.
  const double flatten_b =
      frameworks_ && s.separate_fp32_master && !s.flat_grad_partition && sb_.grad < sb_.step_grad
          ? sb_.grad
          : 0.0;
  const double step_copies = sb_.step_grad + flatten_b;
  const double bytes =
      local_opt_params * (sb_.grad + sb_.step_grad + 2 * flatten_b + 2 * sb_.master + sb_.param) +
      2 * opt_elems_local * sb_.moment;
  const double bw = hw.calibration && hw.calibration->memory_bandwidth_Bps
                        ? *hw.calibration->memory_bandwidth_Bps
                        : hw.hbm_bandwidth_Bps;
  const double dur = bytes / bw;
  const double st = issue(Stream::compute, t, Stream::compute, dur, "optimizer step", -1);
  mem(st, local_opt_params * step_copies, Category::gradients, Phase::optimizer, -1, 1);
  mem(st + dur, -local_opt_params * step_copies, Category::gradients, Phase::optimizer, -1, 1);
  // torch.optim.Adam/AdamW with foreach (the default on GPUs; torch/optim/adam.py,
  // _multi_tensor_adam) first writes sqrt(exp_avg_sq) of every local parameter into new
  // tensors: one intermediate of the local shard in the state dtype. DeepSpeed's FusedAdam
  // updates in place.
  const bool foreach_adam = frameworks_ && s.flavour != Flavour::deepspeed &&
                            (j.optimizer == Optimizer::adam || j.optimizer == Optimizer::adamw);
  if (foreach_adam) {
    mem(st, local_opt_params * sb_.moment, Category::optimizer_states, Phase::optimizer, -1, 1);
    mem(st + dur, -local_opt_params * sb_.moment, Category::optimizer_states, Phase::optimizer, -1,
        1);
  }
  result_.optimizer_s = dur;
  return st + dur;
}

double Simulation::host_optimizer(double t, const States& states) {
  const auto& hw = *in_.hardware;
  const auto& s = spec_;
  const double local_opt_params = states.local_opt_params;
  // CPU optimizer (DeepSpeed's CPUAdam; torch.optim.AdamW on CPU tensors under FSDP's
  // CPUOffload): the node's CPUs update every local shard of its GPUs, then the updated
  // parameters return over the host link.
  const double rate =
      hw.host_optimizer_rate(s.flavour == Flavour::deepspeed ? "deepspeed" : "torch");
  const double cpu = local_opt_params * in_.cluster.gpus_per_node / rate;
  const double h2d = local_opt_params * sb_.compute / hw.host_link_Bps;
  const double st = issue(Stream::host, t, Stream::compute, cpu, "CPU optimizer step", -1);
  if (trace_ && cpu > 0) trace_->spans.back().host_cpu = true;
  issue(Stream::host, st + cpu, Stream::compute, h2d, "parameters to device", -1);
  result_.host_optimizer_s = cpu;
  if (!hw.collectives_block) result_.exposed_s[static_cast<int>(Stream::host)] += cpu + h2d;
  free_at_[0] = st + cpu + h2d;
  return free_at_[0];
}

double Simulation::gather_updated_parameters(double t, const States& states) {
  const auto& hw = *in_.hardware;
  const auto& s = spec_;
  // ZeRO-3: the persistent parameters (kept whole, below stage3_param_persistence_threshold)
  // are all-gathered from their updated partitions once the step is done (stage3.py, _post_step:
  // persistent_parameters[0].all_gather: one call per tensor, costed as one of their total),
  // outside the backward's overlap.
  const double persistent = persistent_params();
  if (persistent > 0) {
    const double dur = coll(Collective::all_gather, shard_group_, persistent * compute_b_);
    const double st =
        issue(Stream::all_gather, t, Stream::compute, dur, "persistent parameter all-gather", -1);
    if (!hw.collectives_block) result_.exposed_s[static_cast<int>(Stream::all_gather)] += dur;
    free_at_[0] = st + dur;
    t = st + dur;
  }
  // ZeRO-1/2: every rank all-gathers the updated parameters it does not own.
  if (s.shard_optimizer && !s.shard_parameters) {
    const double dur = bucketed(Collective::all_gather, shard_group_,
                                states.total_params * sb_.compute, s.allgather_bucket_bytes);
    const double st =
        issue(Stream::all_gather, t, Stream::compute, dur, "parameter all-gather", -1);
    if (!hw.collectives_block) result_.exposed_s[static_cast<int>(Stream::all_gather)] += dur;
    free_at_[0] = st + dur;
    t = st + dur;
  }
  return t;
}

void Simulation::account_states(const States& states) {
  const auto& m = *in_.model;
  const auto& s = spec_;
  const double S = shard_;
  result_.model_states[static_cast<int>(Category::parameters)] = states.param_bytes;
  result_.model_states[static_cast<int>(Category::optimizer_states)] = states.opt_bytes;
  double grads = 0;
  for (int k = 0; k < 3; ++k) {
    const double count = k == 1 ? static_cast<double>(m.layers) : 1.0;
    const double g = s.shard_gradients
                         ? units_[k].params / S * (s.flat_grad_partition ? flat_grad_b_ : sb_.grad)
                         : units_[k].params * sb_.grad;
    grads += count * g;
  }
  if (s.offload != Offload::none && s.shard_gradients) grads = 0;
  result_.model_states[static_cast<int>(Category::gradients)] = grads;
}

// Overheads outside the allocator's view: CUDA context, NCCL workspace, fragmentation reserve.
void Simulation::add_overheads() {
  const auto& hw = *in_.hardware;
  const double frag = hw.fragmentation * result_.allocated_peak_bytes;
  const double overhead = hw.cuda_context_bytes + hw.nccl_workspace_bytes + frag;
  result_.reserve_bytes = frag;
  result_.device_bytes = hw.cuda_context_bytes + hw.nccl_workspace_bytes;
  result_.at_peak[static_cast<int>(Category::overhead)] += overhead;
  result_.peak_bytes = result_.allocated_peak_bytes + overhead;
}

// Time of the step: all micro-batches. compute busy time scales the same way.
void Simulation::account_compute(std::int64_t gas, const FirstMicroBatch& first) {
  double compute_per_mb = 0;
  for (int u = 0; u < n_units_; ++u) {
    const auto& ui = info(u);
    compute_per_mb += ui.fwd_s + ui.bwd_s + ui.recompute_s;
    result_.forward_per_mb_s += ui.fwd_s;
    result_.backward_per_mb_s += ui.bwd_s + ui.recompute_s;
  }
  result_.compute_s = compute_per_mb * static_cast<double>(gas) + result_.optimizer_s;
  double recompute_per_mb = 0;
  for (int u = 0; u < n_units_; ++u) recompute_per_mb += info(u).recompute_s;
  result_.recompute_s = recompute_per_mb * static_cast<double>(gas);
  for (int u = 0; u < n_units_; ++u)
    for (int c = 0; c < kComputeKinds; ++c)
      result_.compute_by_kind_s[c] += info(u).kinds[c] * static_cast<double>(gas);
  result_.compute_by_kind_s[static_cast<int>(ComputeKind::recompute)] = result_.recompute_s;
  result_.compute_by_kind_s[static_cast<int>(ComputeKind::optimizer)] = result_.optimizer_s;
  if (gas > 1) {  // the first simulated micro-batch stands for gas − 1 of them
    const double extra = static_cast<double>(gas - 2);
    for (int k = 0; k < kStreams; ++k) {
      result_.busy_s[k] += extra * first.busy[k];
      result_.exposed_s[k] += extra * first.exposed[k];
    }
    result_.comm_bytes_per_gpu += extra * first.bytes;
    for (int k = 0; k < kCollectives; ++k)
      result_.comm_bytes_by_op[k] += extra * first.bytes_by_op[k];
  }
}

StepResult Simulation::run() {
  const auto& m = *in_.model;
  const auto& hw = *in_.hardware;
  const auto& j = in_.job;
  result_.params = m.total_params();
  result_.micro_batch = j.micro_batch;
  result_.capacity_bytes = hw.memory_bytes;
  if (!check_plan()) return result_;
  prepare();
  const std::int64_t per_gpu = j.global_batch / world_;
  const std::int64_t gas = per_gpu / j.micro_batch;
  result_.grad_accumulation = gas;

  const auto states = place_states();  // present before the step starts
  if (!states) return result_;
  const FirstMicroBatch first = run_micro_batches(gas);
  double t = *std::max_element(free_at_.begin(), free_at_.end());
  wait_for_reductions();
  t = optimizer_step(t, *states);
  // zero_grad(set_to_none=True): the gradients kept across micro-batches are released.
  mem(t, -kept_grad_bytes_, Category::gradients, Phase::optimizer, -1, 1);

  // ---- totals
  const double mb_tail = t - first.seconds;
  result_.step_s = gas > 1 ? first.seconds * static_cast<double>(gas - 1) + mb_tail : t;
  walk_memory();
  account_states(*states);
  add_overheads();
  account_compute(gas, first);
  if (context_ > 1) {
    double per_mb = 0;
    for (std::int64_t b = 0; b < m.layers; ++b)
      per_mb += ring_.forward_sent * (j.block_checkpointed(b) ? 2 : 1) + ring_.backward_sent;
    result_.context_bytes_per_gpu = per_mb * static_cast<double>(gas);
  }
  result_.exposed_comm_s = std::max(0.0, result_.step_s - result_.compute_s);
  const double tokens_step = static_cast<double>(j.global_batch * j.seq_len);
  result_.tokens_per_s = tokens_step / result_.step_s;
  // Model FLOPs: forward + backward (3× forward) without recompute, whole job.
  double fwd_flops_mb = 0;
  for (int u = 0; u < n_units_; ++u) fwd_flops_mb += info(u).fwd_flops;
  result_.model_flops = 3.0 * fwd_flops_mb * static_cast<double>(gas) * world_;
  result_.mfu =
      result_.model_flops / (result_.step_s * world_ * hw.peak(compute_dtype(j.precision)));
  return result_;
}

}  // namespace

const char* stream_name(Stream s) {
  switch (s) {
  case Stream::compute:
    return "compute";
  case Stream::all_gather:
    return "all-gather";
  case Stream::reduce_scatter:
    return "reduce-scatter";
  case Stream::all_reduce:
    return "all-reduce";
  case Stream::host:
    return "host transfers";
  case Stream::context:
    return "context ring";
  }
  return "?";
}

StepResult simulate_step(const StepInput& in, Trace* trace) {
  const int c = in.context_parallel;
  if (c <= 1) {
    Simulation sim(in, trace);
    return sim.run();
  }
  // One rank of the ring: its share of each sequence, c times as many such shares per step.
  StepInput rank = in;
  rank.job.seq_len = in.job.seq_len / c;
  rank.job.global_batch = in.job.global_batch * c;
  if (in.job.seq_len % c != 0 || rank.job.seq_len == 0) {
    StepResult r;
    r.valid = false;
    r.reason_input = "--context-parallel";
    r.reason =
        fmt::format("sequence {} does not divide over context parallel {}", in.job.seq_len, c);
    return r;
  }
  Simulation sim(rank, trace);
  return sim.run();
}

PlanPrediction prediction_from(const StepResult& r) {
  PlanPrediction p;
  p.peak_bytes = r.peak_bytes;
  p.at_peak = r.at_peak;
  p.step_s = r.step_s;
  p.compute_s = r.compute_s;
  p.exposed_comm_s = r.exposed_comm_s;
  p.comm_bytes_per_gpu = r.comm_bytes_per_gpu;
  p.peak_when = r.peak_when;
  return p;
}

}  // namespace shardplan::costmodel
