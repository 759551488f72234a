// The step simulator's walk (simulator.hpp), in parts: its state and the ops it records, shared by
// simulator.cpp (the micro-batches' forward and backward, the reductions, the memory timeline),
// simulator_exchanges.cpp (tensor parallelism's collectives and the ring beside a block) and
// simulator_setup.cpp (the plan's check, the units' sizes and times, the model states, the
// optimizer step, the accounting). Not part of the cost model's interface.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/context_ring.hpp"
#include "costmodel/simulator.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/parallel.hpp"
#include "documents/pipeline_order.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"

namespace shardplan::costmodel::step_walk {

enum class Phase : std::uint8_t { setup, forward, backward, recompute, reduce, optimizer, gather };

const char* phase_name(Phase p);

struct MemEvent {
  double t;
  double bytes;  // + allocation, − free
  documents::Category cat;
  Phase phase;
  std::int8_t gathered;  // +1/−1 when a gathered unit appears/disappears
  int unit;
  int micro_batch;
};

// Per-unit quantities (embeddings, one block, head): elements, seconds and bytes per micro-batch.
struct UnitInfo {
  double params = 0;     // elements
  double grads = 0;      // elements of the gradient autograd makes (torch's row-wise table: whole)
  double plain = 0;      // of params, plain tensors beside a TP plan's DTensors (foreach groups)
  double shardable = 0;  // elements that get partitioned (the rest stays whole)
  double gather = 0;     // elements all-gathered before use (tied head: + the embedding matrix)
  double matmul = 0;     // elements of GEMM weights (autocast copies)
  double opt_elems = 0;  // optimizer-state elements
  double first_grads = 0;  // blocks: elements whose gradients come first, the MLP's down projection
  double first_matmul = 0;  // of `matmul`, its weight (whose autocast copy its backward releases)
  double mlp_grads = 0;     // blocks: elements of the MLP and the norm before it (first_grads too)
  double mlp_matmul = 0;    // of `matmul`, the MLP's weights
  // Elements of the largest tensor among the MLP's (mlp_grads) and among the others: the largest
  // new gradient a later micro-batch's backward makes before adding it into .grad.
  double largest_mlp = 0, largest_rest = 0;
  double fwd_s = 0, bwd_s = 0, recompute_s = 0;
  ComputeTimes fwd_kinds{};  // the forward's seconds by kind (host_overhead: the host's excess)
  ComputeTimes kinds{};      // forward and backward's seconds by kind
  double fwd_flops = 0;      // per micro-batch
  double gather_bytes = 0;   // the all-gathered unit in the compute dtype
  double gather_s = 0;       // its all-gather (plus the host upload of offloaded shards)
  double gather_sent = 0;    // bytes one rank sends for it
  ActivationBytes act;
  // A block whose backward makes the down projection's gradient beside the activation's
  // transient first (act.mlp_backward), and one whose MLP releases what it kept before the
  // attention's gradients (act.mlp_released).
  bool down_first() const { return act.mlp_backward > 0 && first_grads > 0; }
  bool mlp_first() const { return act.mlp_released > 0 && mlp_grads > 0; }
};

// "embeddings", "block 3", "head".
std::string unit_label(int u, int units);

// The units one rank walks, by their index in the model (0 the embeddings, 1 .. L the blocks,
// L + 1 the head): the whole model, or a pipeline stage's model chunks (pipeline_walk.cpp), each
// a run of consecutive units the schedule's ops take forward or backward as one.
struct Chunk {
  int first = 0, last = 0;  // units, inclusive
};
struct StageUnits {
  std::vector<Chunk> chunks;  // empty: the whole model, one chunk
  int stages = 1;             // p: the data-parallel ranks are the GPUs / (t·p)
  // Who runs the stages (RecipeTraits::pipeline): the buffers it keeps around a micro-batch's
  // forward and backward (Simulation::stage_op).
  documents::PipelineRunner runner = documents::PipelineRunner::megatron;
  bool torch_pipelining() const { return runner == documents::PipelineRunner::torch_pipelining; }
  documents::PipelineSchedule schedule = documents::PipelineSchedule::one_f_one_b;
};

class Simulation {
public:
  Simulation(const StepInput& in, Trace* trace, StageUnits stage = {})
      : in_(in), spec_(in.spec), trace_(trace), comm_(*in.hardware),
        frameworks_(in.accounting == Accounting::framework &&
                    documents::recipe_traits(in.job.recipe).framework),
        stage_(std::move(stage)) {
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
    const bool deepspeed_pipe =
        stage_.stages > 1 && stage_.runner == documents::PipelineRunner::deepspeed;
    if (frameworks_ && documents::runs_bf16_optimizer(spec_, in.job.precision, deepspeed_pipe))
      spec_ = documents::as_bf16_optimizer(spec_);
    straggler_fraction_ = in.hardware->straggler_wait_fraction(in.cluster.gpus);
    context_ = std::max(1, in.context_parallel);
    tensor_ = std::max(1, in.tensor_parallel);
    sequence_parallel_ = tensor_ > 1 && in.sequence_parallel;
    async_tp_ = tensor_ > 1 && in.async_tensor_parallel;
    // FSDP2's groups (documents::Fsdp2Groups): under "ends" the embedding, each block, the final
    // norm with the head (kept gathered from its forward to its backward); no root group holding
    // the embeddings with the head, and the loss's backward runs before the head group's
    // pre-backward hook. A tied table's head group holds the table (accelerate's tail group,
    // measured: oracle_accelerate_steps.json, GPT-2's [ln_f, wte, lm_head]; torchtitan's
    // apply_fsdp groups [tok_embeddings, norm, lm_head] when weights are tied,
    // torchtitan/distributed/fsdp.py), which the embedding's lookup uses first: gathered from the
    // first forward, and with no post-backward hook of its own (the token ids need no gradient)
    // its gradients stay unsharded to the root's final callback (FSDPParamGroup.post_backward
    // from _root_post_backward_final_callback): the root unit's moments.
    if (spec_.flavour == documents::Flavour::fsdp2 &&
        in.job.fsdp2_groups.value_or(documents::recipe_traits(in.job.recipe).fsdp2_groups) ==
            documents::Fsdp2Groups::ends) {
      spec_.root_unit = in.model->tied_embeddings;
      spec_.keep_root_unsharded = false;
      loss_outside_head_group_ = true;
    }
    if (keep_gathered()) spec_.reshard_after_forward = false;
  }

  StepResult run();

  // A pipeline stage's step, op by op in its schedule's order (pipeline_walk.cpp): begin() checks
  // the plan and places the states (false: result() says why), stage_op() runs one micro-batch's
  // forward or backward through one model chunk once its input is `ready` and returns when its
  // compute ends, finish() waits for the reductions, adds `after_reduce` seconds of a collective
  // before the optimizer step (the tied embedding's all-reduce) and steps.
  bool begin();
  double stage_op(const documents::PipeOp& op, double ready, bool first, bool last);
  StepResult finish(double after_reduce, double after_reduce_bytes);
  const StepResult& result() const { return result_; }
  // After begin(): the compute of one micro-batch through chunk `c`'s units, forward or backward
  // (recompute included), alone on the stream.
  double chunk_seconds(std::size_t c, bool backward) const {
    double sum = 0;
    for (int u = stage_.chunks.at(c).first; u <= stage_.chunks.at(c).last; ++u)
      sum += backward ? info(u).bwd_s + info(u).recompute_s : info(u).fwd_s;
    return sum;
  }

private:
  // Parameters every rank keeps whole although parameters are sharded (ZeRO-3's persistent
  // tensors), all units together.
  double persistent_params() const {
    if (!spec_.shard_parameters) return 0;
    double n = 0;
    for (int k = 0; k < 3; ++k) n += unit_count(k) * (units_[k].params - units_[k].shardable);
    return n;
  }

  // How many units of each kind (0 the embeddings, 1 the blocks, 2 the head) the rank walks.
  double unit_count(int k) const { return counts_[static_cast<std::size_t>(k)]; }
  // Schedules an op on a stream once `ready`; returns its start. `cause` is the stream whose
  // completion made it ready (for attributing compute idle time).
  double issue(Stream s, double ready, Stream cause, double dur, const char* what, int unit);
  // Records an allocation (bytes > 0) or a free at time t, keeping the timeline in time order
  // (stable: equal times keep the order they were recorded in). Ops are recorded nearly in time
  // order, so the insertion moves an event back by a few places at most.
  void mem(double t, double bytes, documents::Category c, Phase p, int unit, int mb,
           int gathered = 0) {
    if (bytes == 0 && gathered == 0) return;
    events_.push_back({t, bytes, c, p, static_cast<std::int8_t>(gathered), unit, mb});
    for (std::size_t i = events_.size() - 1; i > 0 && events_[i - 1].t > t; --i)
      std::swap(events_[i - 1], events_[i]);
  }
  double coll(documents::Collective op, const Group& g, double size) {
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
  double bucketed(documents::Collective op, const Group& g, double bytes, double bucket);
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
    return frameworks_ && spec_.flat_grad_partition && spec_.offload == documents::Offload::none;
  }
  bool backward_bucket() const {
    return frameworks_ && spec_.contiguous_grad_bucket && !spec_.flat_grad_partition;
  }
  // The frameworks' reduction once the backward is done (documents::reduces_after_backward):
  // DeepSpeed's ZeRO-1 in buckets, keeping each rank's partition and dropping the whole gradients;
  // Megatron-core's DDP its whole main-gradient buffer in place.
  double largest_flatten_run() const;
  double flatten_to_reduce(int u, double end, int mb);
  // The device memory's bandwidth, calibrated where the profile has it (bytes/s).
  double memory_Bps() const {
    const auto& hw = *in_.hardware;
    return hw.calibration && hw.calibration->memory_bandwidth_Bps
               ? *hw.calibration->memory_bandwidth_Bps
               : hw.hbm_bandwidth_Bps;
  }
  bool flattens_to_reduce() const { return frameworks_ && spec_.flatten_to_reduce; }
  bool reduces_after_backward() const {
    return frameworks_ && documents::reduces_after_backward(spec_);
  }
  // torch DDP wraps the model only where there is a data-parallel group: PyTorch's TP recipes
  // (the others' engines wrap it whatever d) apply it over the replicas (torchtitan's parallelize
  // calls apply_ddp only for a replicate degree above 1; transformers' tp_plan wraps nothing).
  // (Nor does it under a pipeline: apply_ddp too needs a replicate degree above 1.)
  bool ddp_wrapped() const {
    return world_ > 1 || !torch_styles() || (tensor_ == 1 && stage_.stages == 1);
  }
  // Megatron-core's DDP (frameworks): the gradients are its main-gradient buffer, present from the
  // start and kept.
  // So are the executor's pipeline stages' gradients, a buffer per unit allocated with the stage
  // (executor/pipeline.cpp, PipelineTrainer).
  bool main_grad_buffer() const {
    return (frameworks_ && spec_.main_grad_buffer) || (executor_stages() && !spec_.shard_gradients);
  }
  // The executor's pipeline trainer (executor/pipeline.cpp), not its engine: the stage's
  // gradients reduced in place once its backwards are done, no bucket.
  bool executor_stages() const { return !frameworks_ && stage_.stages > 1; }
  // DeepSpeed stages 1/2 (frameworks): the rank's gradient partition is one buffer, allocated
  // whole by the first reduced bucket of a step (stage_1_and_2.py, copy_grads_in_partition) and
  // kept to the step.
  bool whole_partition_buffer() const {
    return frameworks_ && spec_.flavour == documents::Flavour::deepspeed && spec_.shard_optimizer &&
           !spec_.flat_grad_partition && spec_.contiguous_grad_bucket &&
           spec_.offload == documents::Offload::none;
  }
  // FSDP1 (frameworks): the module holds plain views of each unit's flat parameter
  // (torch/distributed/fsdp/_flat_param.py, _use_unsharded_views), so autograd gives each view
  // its own gradient and makes the flat one from them (the views' split backward) once the unit's
  // last view has its gradient.
  bool split_views() const { return frameworks_ && spec_.flavour == documents::Flavour::fsdp1; }
  // A later micro-batch's gradients into .grad without DDP (torch.distributed.pipelining's stages
  // of a rank with no replica): autograd's AccumulateGrad makes each new gradient, a tensor of its
  // parameter's size, and adds it in place (torch/csrc/autograd/functions/accumulate_grad.h,
  // variable_grad += new_grad).
  // FSDP under torch.distributed.pipelining: torchtitan's "default" reshard_after_forward is
  // False when pipeline parallelism is on (torchtitan/models/llama3/infra/parallelize.py), and
  // the stage's backwards run without gradient sync and without resharding until the last
  // (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync): each unit is gathered
  // once, kept to the step's last backward, its unsharded gradient accumulated to then.
  bool keep_gathered() const { return stage_.torch_pipelining() && stage_.stages > 1; }
  bool accumulated_gradients() const {
    return frameworks_ && stage_.torch_pipelining() && !ddp_wrapped() && !spec_.shard_gradients;
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
  // (kept for backward) and its input. So is FSDP's without a param_dtype (ShardingSpec::
  // fp32_gathered) over the fp32 parameters it gathers.
  bool autocast_copies() const { return frameworks_ && (ddp_mixed() || act_b_ < compute_b_); }
  // The executor's DDP under mixed precision (executor/gather_scheduler.hpp, copy_into): each
  // unit's fp32 parameters cast whole into a 16-bit buffer as the unit's forward starts, kept to
  // its backward's end (the embeddings' for their forward only; a tied head's copy of the
  // embedding matrix beside its own); and each unit's backward writes a 16-bit gradient widened
  // into the fp32 one after it (executor/grad_buffer.hpp, widen_whole; a tied head's share of the
  // embedding's until the embeddings' backward).
  bool executor_casts() const {
    return !frameworks_ && in_.accounting == Accounting::framework && ddp_mixed();
  }
  // DDP over fp32 parameters computing in a 16-bit dtype.
  bool ddp_mixed() const {
    return spec_.flavour == documents::Flavour::ddp && sb_.compute < sb_.param;
  }
  // Elements of the embedding matrix a tied head projects with (0 when the head has its own).
  // Megatron-core's vocabulary-parallel embedding and head share the rank's [V/t, h] rows.
  double tied_matrix() const {
    return in_.model->tied_embeddings
               ? static_cast<double>(in_.model->embedding.tensors.front().elements()) / tensor_
               : 0.0;
  }
  // A tied table the rank's embeddings and head share (not a pipeline's first and last stage,
  // each with its own copy: prepare_unit_sizes).
  bool shared_table() const {
    return in_.model->tied_embeddings && unit_count(0) > 0 && unit_count(2) > 0;
  }
  // Whose tensor parallelism splits the units: PyTorch's parallel styles as the recipe's plan
  // applies them, or Megatron-core's layers.
  bool torch_styles() const {
    return documents::recipe_traits(in_.job.recipe).tensor_parallel ==
           documents::TensorParallelCode::torch_styles;
  }
  // The step's per-unit sizes and times, the groups, and the cleared timeline.
  void prepare();
  void prepare_bytes();
  void prepare_unit_sizes();
  // Tensor parallelism: each unit's elements on the rank (torch_tp_elements).
  void split_unit_sizes();
  documents::ParallelLayout tensor_layout() const;  // t, sequence parallel, async; the rest 1
  // Each unit's activations on the rank: a block's from its table (block_table.hpp), split by
  // whose tensor parallelism the recipe runs; a framework's head under TP; the executor's
  // transients and head (executor_tensors).
  void block_unit_activations(const Forward& f);
  void split_head_activations(const Forward& f);
  void executor_unit_activations(const Forward& f);
  void prepare_unit_times();
  void prepare_gathers();
  // One micro-batch's forward and backward; `first`: the first of the step (gradients are
  // allocated), `reduce`: its gradients are reduced.
  void micro_batch(int mb, bool first, bool reduce);
  // One micro-batch's forward or backward through the units of chunk `c`.
  void forward(int mb, const Chunk& c);
  void backward(int mb, bool first, bool reduce, const Chunk& c);
  // All-gathers unit u's parameters once `issue_t`; returns when they are ready.
  double gather(int u, double issue_t, Phase phase, int mb);
  // A checkpointed unit's forward again before its backward (from `ready`, waiting on `cause`).
  void rerun_forward(int u, double ready, Stream cause, int mb);
  // Unit g's gradients appear at t: kept whole (DDP, ZeRO-1) they are allocated by the step's
  // first micro-batch and kept to the step; sharded, the unit's full gradient is a transient
  // until it is reduced.
  void gradients_used(int g, double t, int mb, bool first) {
    gradients_used(g, t, mb, first, info(g).params, info(g).largest_rest);
  }
  // `largest`: elements of the largest of those tensors (accumulated_gradients()).
  void gradients_used(int g, double t, int mb, bool first, double elems, double largest);
  // A framework on a rank whose collectives block the computing thread (gloo on a CPU): the
  // all-gathers unit u's pre-backward hook issues for the next units (FSDP's BACKWARD_PRE
  // prefetch, at most max_inflight_allgathers gathered), run in the thread's order, before u's
  // backward. (The executor's CPU engine gathers a unit when it is about to run.)
  void blocking_backward_prefetch(int u, int mb);
  // The copies unit u's gradients pass through at its backward's end: FSDP1's flat gradient out
  // of its views', FSDP2's redistribution of a gradient placed otherwise than its parameter.
  void gradient_copies(int u, double end, int mb);
  // Unit u's exchanges beside its forward or backward from `st`: a block's ring (context
  // parallelism) and tensor parallelism's collectives.
  void block_exchanges(int u, double st, bool backward, int mb);
  // Unit u's transient of the loss's backward at t (the head's; every unit's own transient).
  void loss_backward(int u, double t, int mb);
  // Block u's backward from t, its MLP first, as autograd runs it: the down projection's gradient
  // beside the activation's transient (act.mlp_backward > 0), then the transient gone; the MLP's
  // other gradients; then, with what the MLP kept released (act.mlp_released, and its autocast
  // weight copies), the attention's gradients.
  void block_backward(int u, double t, int mb, bool first);
  // Unit u's gradients as its backward kernels run from `kernels` (simulator.cpp says when each
  // is made).
  void unit_gradients(int u, double kernels, int mb, bool first);
  // executor_casts(): unit u's 16-bit copy released at the end of its backward, and its 16-bit
  // gradient from its kernels to the end.
  void executor_backward_casts(int u, double kernels, double end, int mb);
  // FSDP2's reduce-scatter input and output for the pending reduction (simulator.cpp).
  void fsdp2_copy_in_buffers(int u, double end, double rs, double done, int mb);
  // FSDP1's buffers beside the pending reduction: its cast to the reduce dtype from `end`, its
  // output shard from the reduce-scatter's start `rs`, both until it is `done`.
  void fsdp1_reduce_buffers(int u, double end, double rs, double done, int mb);
  // Unit u's gradients join the pending reduction, reduced once the framework's bucket is full.
  void queue_reduction(int u, double end, int mb);
  // A block's ring exchange beside its attention (from `start`, the attention's `attention_s`
  // at the end of the unit's `unit_s`): its buffers for the unit's span, its bytes, and the
  // compute stream's wait for it.
  void ring_exchange(int u, double start, double unit_s, double attention_s, bool backward,
                     Phase phase, int mb);
  void pipeline_reduce_bucket(int u, double at, int mb);
  void reduce_pending(int u, double end, int mb);
  // A unit's tensor-parallel collectives of its activations (`pass`: the forward, the backward,
  // or a block's rerun forward) at the end of its compute from `start` for `unit_s`; async
  // tensor parallelism runs them beside the unit's `gemm_s` of GEMMs. The compute stream waits
  // for them.
  enum class TpPass : std::uint8_t { forward, backward, selective_rerun };
  void tensor_exchange(int u, double start, double unit_s, double gemm_s, TpPass pass);
  // Unit u's collectives of a pass (`count` of each, on `bytes`), and the bytes one rank sends
  // for them.
  struct TpCollective {
    documents::Collective op;
    double bytes;
    int count;
  };
  std::vector<TpCollective> tensor_collectives(int u, TpPass pass) const;
  double tensor_sent(int u, TpPass pass);
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
    std::array<double, documents::kCollectives> bytes_by_op{};
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
  // `first`: the walked micro-batch that stands for the ones not walked (none: all walked).
  void account_compute(std::int64_t gas, const FirstMicroBatch* first);
  // The result's totals once the step is walked (its step_s set).
  void summarize(const FirstMicroBatch* first);

  const StepInput& in_;
  documents::ShardingSpec spec_;  // the plan, normalized for the accounting mode
  Trace* trace_;
  CommModel comm_;
  // The frameworks' own code runs (as measured: tests/costmodel/data/oracle_*.json), not the ZeRO
  // paper's model states alone nor this project's executor (executor/engine.cpp), whose engine
  // gathers the embeddings and head apart, reduces in place, steps AdamW in place, keeps
  // DeepSpeed's stage-3 gradient partition in fp32 and sizes its reduce buckets in bytes.
  const bool frameworks_;
  StageUnits stage_;                // the units walked, in chunks (the whole model: one)
  std::array<double, 3> counts_{};  // of them, embeddings, blocks, head
  std::optional<States> states_;    // begin()'s, for finish()
  Chunk walking_;                   // the chunk whose forward or backward is being walked
  // torch.distributed.pipelining's buffers (stage_op): the input gradient whose send is not yet
  // waited on, and the bytes kept to the step's end.
  double pending_send_ = 0, held_to_end_ = 0;
  bool second_bucket_ = false;  // DeepSpeed's pipeline ReduceGrads bucket, until released
  bool pipe_held_ = false;      // DeepSpeed's buffers kept from the step before, placed
  StepResult result_;
  documents::StateBytes sb_;
  std::array<UnitInfo, 4> units_;  // embeddings, block, head, checkpointed block
  int n_units_ = 0;
  int world_ = 1, shard_ = 1;  // ranks; shard group size
  Group shard_group_, replica_group_;
  bool hsdp_ = false;
  int fwd_prefetch_ = 1;
  // Bytes of an element reduced, gathered (and of a fresh gradient), and of the dtype the
  // forward computes and keeps its activations in (autocast's under fp32_gathered).
  double reduce_b_ = 2, compute_b_ = 2, act_b_ = 2;
  double flat_grad_b_ = 4;  // bytes per element of DeepSpeed ZeRO-3's flat gradient partition
  // FSDP2's "ends" groups: the loss is computed outside the head's group (Simulation()).
  bool loss_outside_head_group_ = false;
  // DeepSpeed's stage 0: bytes of the largest run of gradients flattened for one all-reduce
  // (documents::ShardingSpec::flatten_to_reduce).
  double flatten_run_bytes_ = 0;
  std::array<double, kStreams> free_at_{};  // when each stream is next free
  std::vector<double> fwd_start_, fwd_end_, bwd_start_, bwd_end_, gathered_free_;
  std::vector<char> gathered_alive_;
  std::vector<char> reduced_;     // a unit's gradients reduced once: its shard exists
  std::vector<MemEvent> events_;  // the memory timeline, in time order
  struct CachedCost {
    documents::Collective op;
    int ranks, per_node;
    double size;
    CollectiveCost cost;
  };
  std::array<CachedCost, 8> cost_cache_{};
  std::size_t cache_next_ = 0;
  double pending_reduce_bytes_ = 0;
  std::vector<int> pending_units_;
  double reduce_input_done_ = 0;   // FSDP2: when the last reduce-scatter input may be released
  double reduce_input_held_ = 0;   // FSDP2: bytes of that input, kept until the next copy-in
  bool partition_placed_ = false;  // DeepSpeed stages 1/2: the step's gradient partition exists
  double total_params_ = 0;        // the model's parameters (elements)
  double kept_grad_bytes_ = 0;     // gradients kept until zero_grad at the end of the step
  // Tensor parallelism: the ranks splitting each unit, their group, whether the norms run on the
  // rank's share of the tokens (sequence parallelism) and whether the collectives overlap the
  // GEMMs (async); the [T, h] activation they move.
  int tensor_ = 1;
  bool sequence_parallel_ = false, async_tp_ = false;
  Group tensor_group_;
  double tp_buffer_bytes_ = 0;
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

}  // namespace shardplan::costmodel::step_walk
