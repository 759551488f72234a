#include "costmodel/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "costmodel/compute_time.hpp"
#include "costmodel/context_ring.hpp"
#include "costmodel/simulation.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/job.hpp"
#include "documents/plan.hpp"
#include "documents/sharding.hpp"

namespace shardplan::costmodel {

using documents::Breakdown;
using documents::Category;
using documents::Collective;
using documents::compute_dtype;
using documents::Offload;
using documents::PlanPrediction;
namespace step_walk {

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

std::string unit_label(int u, int units) {
  if (u == 0) return "embeddings";
  if (u == units - 1) return "head";
  return fmt::format("block {}", u - 1);
}

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

void Simulation::micro_batch(int mb, bool first, bool reduce) {
  const Chunk all{0, n_units_ - 1};
  forward(mb, all);
  backward(mb, first, reduce, all);
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

void Simulation::forward(int mb, const Chunk& c) {
  const auto& s = spec_;
  const int U = n_units_;
  const int lo = c.first, hi = c.last;
  walking_ = c;
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
  for (int u = hi; u >= lo; --u) after[u] = after[u + 1] + info(u).params;
  const double R = frameworks_ ? s.reuse_distance_elems : 0;
  auto kept_through_backward = [&](int u) {
    if (!s.reshard_after_forward) return true;
    if (in_.accounting == Accounting::zero_paper) return false;
    if (u == hi) return true;
    if (R > 0 && R / 2 - after[u + 1] >= info(u).params / 2) return true;
    return (s.keep_root_unsharded || s.root_unit) && u == 0;
  };

  double cached_casts = 0;  // bytes of checkpointed blocks' weight casts in autocast's cache
  for (int u = lo; u <= hi; ++u) {
    const auto& ui = info(u);
    double ready = 0;
    Stream cause = Stream::compute;
    if (s.shard_parameters && ui.gather > 0 && !gathered_alive_[u]) {
      // Issue: when the CPU reaches this unit's pre-forward, `prefetch` units ahead of the GPU;
      // rate limit: the gathered unit `limit` positions back must be freed.
      const int fp = fwd_prefetch_;
      double issue_t = u - fp >= lo ? (fp == 0 ? fwd_end_[u - 1] : fwd_start_[u - fp]) : 0;
      if (fp == 0 && u == lo) issue_t = free_at_[0];
      if (s.reshard_after_forward && u - s.max_inflight_allgathers >= lo)
        issue_t = std::max(issue_t, gathered_free_[u - s.max_inflight_allgathers]);
      ready = gather(u, issue_t, Phase::forward, mb);
      cause = Stream::all_gather;
    }
    const double st = issue(Stream::compute, ready, cause, ui.fwd_s, "forward", u);
    fwd_start_[u] = st;
    fwd_end_[u] = st + ui.fwd_s;
    block_exchanges(u, st, false, mb);
    mem(st, ui.act.saved + ui.act.forward, Category::activations, Phase::forward, u, mb);
    mem(fwd_end_[u], -ui.act.forward, Category::activations, Phase::forward, u, mb);
    // autocast's casts of the weights are tensors autograd keeps, like the activations; a
    // checkpointed block keeps none, and its casts live in autocast's cache until the forward's
    // autocast region ends with the loss (torch/csrc/autograd/autocast_mode.cpp, cached_cast and
    // clear_cache on leaving the outermost region).
    if (autocast_copies) {
      mem(st, ui.matmul * act_b_, Category::activations, Phase::forward, u, mb);
      cached_casts += checkpointed(u) ? ui.matmul * act_b_ : 0;
    }
    if (executor_casts()) {
      mem(st, (ui.params + (u == U - 1 && shared_table() ? tied_matrix() : 0)) * compute_b_,
          Category::buffers, Phase::forward, u, mb);
      if (u == 0)
        mem(fwd_end_[u], -ui.params * compute_b_, Category::buffers, Phase::forward, u, mb);
    }
    if (s.shard_parameters && gathered_alive_[u] && !kept_through_backward(u)) {
      mem(fwd_end_[u], -ui.gather_bytes, Category::buffers, Phase::forward, u, mb, -1);
      gathered_alive_[u] = 0;
      gathered_free_[u] = fwd_end_[u];
    }
  }
  if (cached_casts > 0)
    mem(fwd_end_[hi], -cached_casts, Category::activations, Phase::forward, hi, mb);
}

void Simulation::backward(int mb, bool first, bool reduce, const Chunk& c) {
  const auto& s = spec_;
  const int U = n_units_;
  const int lo = c.first, hi = c.last;
  walking_ = c;
  const bool shard_params = s.shard_parameters;
  const bool autocast_copies = this->autocast_copies();
  pending_reduce_bytes_ = 0;
  pending_units_.clear();
  for (int u = hi; u >= lo; --u) {
    const auto& ui = info(u);
    double ready = 0;
    Stream cause = Stream::compute;
    if (shard_params && ui.gather > 0 && !gathered_alive_[u]) {
      const int bp = s.backward_prefetch;
      double issue_t = u + bp <= hi ? (bp == 0 ? bwd_end_[u + 1] : bwd_start_[u + bp]) : 0;
      if (u + s.max_inflight_allgathers <= hi)
        issue_t = std::max(issue_t, bwd_end_[u + s.max_inflight_allgathers]);
      ready = gather(u, issue_t, Phase::backward, mb);
      cause = Stream::all_gather;
    }
    // The loss's backward outside every FSDP group (no root group whose output is the loss:
    // torchtitan's groups), or outside the head's (FSDP2's "ends"), runs before the head group's
    // pre-backward hook and the prefetch it issues.
    const bool loss_first =
        shard_params && (!s.root_unit || loss_outside_head_group_) && u == U - 1;
    if (loss_first) loss_backward(u, std::max(ready, free_at_[0]), mb);
    if (frameworks_ && shard_params && in_.hardware->collectives_block)
      blocking_backward_prefetch(u, mb);
    if (ui.recompute_s > 0) {
      rerun_forward(u, ready, cause, mb);
      ready = 0;
    }
    const double st = issue(Stream::compute, ready, cause, ui.bwd_s, "backward", u);
    bwd_start_[u] = st;
    const double end = st + ui.bwd_s;
    bwd_end_[u] = end;
    block_exchanges(u, st, true, mb);
    // The unit's backward kernels run after its pre-backward hooks, which issue the next unit's
    // all-gather (FSDP's backward prefetch, recorded at `st`): a moment later.
    const double kernels = st + 1e-3 * ui.bwd_s;
    if (!loss_first) loss_backward(u, kernels, mb);
    mem(kernels, ui.act.projection, Category::activations, Phase::backward, u, mb);
    unit_gradients(u, kernels, mb, first);
    mem(end, -ui.act.projection, Category::activations, Phase::backward, u, mb);
    const double fresh = s.shard_gradients ? ui.params * compute_b_ : 0;
    const bool down_first = ui.down_first(), mlp_first = ui.mlp_first();
    const double released =
        ui.act.loss > 0 ? ui.act.saved - ui.act.loss : ui.act.saved + ui.act.backward;
    mem(end, -(released + ui.act.recompute - (mlp_first ? ui.act.mlp_released : 0)),
        Category::activations, Phase::backward, u, mb);
    if (executor_casts()) executor_backward_casts(u, kernels, end, mb);
    if (autocast_copies) {
      const double gone = mlp_first ? ui.mlp_matmul : down_first ? ui.first_matmul : 0;
      mem(end, -(ui.matmul - gone) * act_b_, Category::activations, Phase::backward, u, mb);
    }
    gradient_copies(u, end, mb);
    if (shard_params && gathered_alive_[u] && (reduce || !keep_gathered())) {
      mem(end, -ui.gather_bytes, Category::buffers, Phase::backward, u, mb, -1);
      gathered_alive_[u] = 0;
    }
    if (s.contiguous_grad_bucket && fresh > 0)
      mem(end, -fresh, Category::gradients, Phase::backward, u, mb);
    if (backward_bucket() && u == hi)
      mem(end, s.reduce_bucket_bytes, Category::buffers, Phase::backward, u, mb);
    if (reduce) queue_reduction(u, end, mb);
  }
  // The bucket goes when the backward's reductions are done (reduce_pending), or at its end.
  if (backward_bucket() && !reduce)
    mem(bwd_end_[lo], -s.reduce_bucket_bytes, Category::buffers, Phase::backward, lo, mb);
}

void Simulation::loss_backward(int u, double t, int mb) {
  const auto& ui = info(u);
  // The loss's backward runs first and releases its transient and what it kept; the
  // projection's gradients come after.
  mem(t, ui.act.backward, Category::activations, Phase::backward, u, mb);
  if (ui.act.loss > 0)
    mem(t, -(ui.act.backward + ui.act.loss), Category::activations, Phase::backward, u, mb);
}

void Simulation::blocking_backward_prefetch(int u, int mb) {
  const auto& s = spec_;
  for (int ahead = 1; ahead <= s.backward_prefetch; ++ahead) {
    const int next = u - ahead;
    if (next < 0) break;
    if (info(next).gather <= 0 || gathered_alive_[next]) continue;
    if (next + s.max_inflight_allgathers <= u) break;  // that unit's backward has not ended
    gather(next, 0, Phase::backward, mb);
  }
}

// Unit u's gradients from its backward kernels' start: kept whole (DDP, ZeRO-1) they are
// allocated on first use and kept to the step; sharded, the unit's full gradient is a transient
// until it is reduced. A tied head's backward adds into the embedding matrix's gradient, so that
// gradient is first used there, not at the embedding's own backward (autograd accumulates into
// the shared weight's .grad from its first use); the embeddings' other tensors (learned
// positions) get theirs in their own backward, unless the unit's gradient is one flat tensor
// (the executor's unit buffer), opened whole by the head. FSDP1's module holds views of its flat
// parameter, each with a gradient of its own until the flat one is made (split_views).
void Simulation::unit_gradients(int u, double kernels, int mb, bool first) {
  const auto& s = spec_;
  const auto& ui = info(u);
  const int U = n_units_;
  const bool flat_unit = !frameworks_;
  const double opened = flat_unit ? info(0).params : tied_matrix();  // by a tied head
  const bool tied = shared_table();
  if (ui.down_first() || ui.mlp_first())
    block_backward(u, kernels, mb, first);
  else
    gradients_used(u, kernels, mb, first, ui.grads - (tied && u == 0 ? opened : 0),
                   ui.largest_rest);
  if (tied && u == U - 1) gradients_used(0, kernels, mb, first, opened, opened);
  if (tied && u == 0 && !flat_unit) {
    // The tied matrix reaches autograd's input buffer twice: the embeddings' gradient is added
    // to the head's out of place (torch's autograd InputBuffer::add), so both and their sum are
    // alive at once before the sum goes on to the parameter (measured: tests/costmodel/data/
    // oracle_steps.json, GPT-2's FSDP2 steps peak there; oracle_accelerate_steps.json, GPT-2's
    // FSDP1 step in fp32 under full checkpointing at b = 1, profiled without the tracker:
    // EmbeddingBackward0 > aten::add, the same under FSDP1's views of its flat parameter).
    const double both = 2 * tied_matrix() * (s.shard_gradients ? compute_b_ : sb_.grad);
    mem(kernels, both, Category::gradients, Phase::backward, u, mb);
    mem(kernels + 1e-3 * ui.bwd_s, -both, Category::gradients, Phase::backward, u, mb);
  }
}

void Simulation::rerun_forward(int u, double ready, Stream cause, int mb) {
  const auto& ui = info(u);
  const double st = issue(Stream::compute, ready, cause, ui.recompute_s, "recompute", u);
  mem(st, ui.act.recompute, Category::activations, Phase::recompute, u, mb);
  if (context_ > 1 && checkpointed(u))  // the rerun forward runs the ring again
    ring_exchange(u, st, ui.recompute_s, ui.fwd_kinds[static_cast<int>(ComputeKind::attention)],
                  false, Phase::recompute, mb);
  // The rerun reruns the forward's collectives: all of them under full checkpointing, those up to
  // the MLP's last input under torchtitan's op-level policy (non-reentrant checkpointing stops
  // once the tensors the backward needs exist).
  // Async, they overlap the rerun's GEMMs (the selective rerun is its save list's matmuls).
  // (Megatron's selective recompute reruns the attention core alone: no collectives.)
  const bool op_level = in_.job.checkpointing == documents::Checkpointing::selective_op;
  if (tensor_ > 1 && (checkpointed(u) || op_level))
    tensor_exchange(u, st, ui.recompute_s,
                    checkpointed(u) ? ui.fwd_kinds[static_cast<int>(ComputeKind::gemm)]
                                    : ui.recompute_s,
                    checkpointed(u) ? TpPass::forward : TpPass::selective_rerun);
  // The recompute runs under the forward's autocast state again (torch/utils/checkpoint.py
  // restores it), and the GEMMs keep their weight casts for the backward.
  if (autocast_copies())
    mem(st, ui.matmul * act_b_, Category::activations, Phase::recompute, u, mb);
}

void Simulation::executor_backward_casts(int u, double kernels, double end, int mb) {
  const auto& ui = info(u);
  const int U = n_units_;
  const double tied = u == U - 1 && shared_table() ? tied_matrix() : 0;
  if (u > 0)  // the copy kept since the forward
    mem(end, -(ui.params + tied) * compute_b_, Category::buffers, Phase::backward, u, mb);
  if (spec_.shard_gradients || sb_.grad < 4) return;  // the gradients are written where they stay
  // The 16-bit gradient widened after the backward; the embeddings' opened by a tied head.
  if (!(u == 0 && shared_table()))
    mem(kernels, ui.params * compute_b_, Category::gradients, Phase::backward, u, mb);
  if (tied > 0 && shared_table())
    mem(kernels, info(0).params * compute_b_, Category::gradients, Phase::backward, 0, mb);
  mem(end, -ui.params * compute_b_, Category::gradients, Phase::backward, u, mb);
}

void Simulation::block_backward(int u, double t, int mb, bool first) {
  const auto& ui = info(u);
  const double step = 1e-3 * ui.bwd_s;  // from one of its moments to the next
  const bool down_first = ui.down_first();
  double made = 0;  // elements whose gradients exist
  if (down_first) {
    if (autocast_copies())  // the down projection's saved weight copy goes with its backward
      mem(t, -ui.first_matmul * act_b_, Category::activations, Phase::backward, u, mb);
    if (!first && accumulated_gradients()) {
      // The down projection's backward: its input's gradient [T, I/t] and the weight's new
      // gradient, added into .grad before the element-wise part's gradients are made.
      const double input_grad = act_b_ * static_cast<double>(in_.job.seq_len) / context_ *
                                static_cast<double>(in_.job.micro_batch) *
                                static_cast<double>(in_.model->intermediate) / tensor_;
      const double made_now = input_grad + ui.first_grads * sb_.grad;
      mem(t, made_now, Category::activations, Phase::backward, u, mb);
      mem(t, -made_now, Category::activations, Phase::backward, u, mb);
    }
    mem(t, ui.act.mlp_backward, Category::activations, Phase::backward, u, mb);
    gradients_used(u, t, mb, first, ui.first_grads, 0);
    made = ui.first_grads;
    t += step;
    mem(t, -ui.act.mlp_backward, Category::activations, Phase::backward, u, mb);
  }
  if (ui.mlp_first()) {
    // Each node of the MLP's backward releases what it saved as it makes its weight's gradient:
    // with the MLP's gradients made, what it kept is gone.
    mem(t, -ui.act.mlp_released, Category::activations, Phase::backward, u, mb);
    if (autocast_copies())
      mem(t, -(ui.mlp_matmul - (down_first ? ui.first_matmul : 0)) * act_b_, Category::activations,
          Phase::backward, u, mb);
    gradients_used(u, t, mb, first, ui.mlp_grads - made, ui.largest_mlp);
    made = ui.mlp_grads;
    t += step;
  }
  gradients_used(u, t, mb, first, ui.params - made,
                 ui.mlp_first() || ui.down_first() ? ui.largest_rest
                                                   : std::max(ui.largest_rest, ui.largest_mlp));
}

void Simulation::gradients_used(int g, double t, int mb, bool first, double elems, double largest) {
  const auto& s = spec_;
  // Added into the buffer that holds them all (BF16_Optimizer keeps the low-precision .grad too).
  if (main_grad_buffer() && !s.low_grads_kept) return;
  const double grad_b = main_grad_buffer() ? compute_b_ : sb_.grad;
  // (A temporary of the backward, not yet a gradient: torch's MemTracker files it so.)
  if (!first && accumulated_gradients() && largest > 0) {
    mem(t, largest * grad_b, Category::activations, Phase::backward, g, mb);
    mem(t, -largest * grad_b, Category::activations, Phase::backward, g, mb);
  }
  if (!s.shard_gradients && first) {
    mem(t, elems * grad_b, Category::gradients, Phase::backward, g, mb);
    kept_grad_bytes_ += elems * grad_b;
  }
  // Unsynchronized micro-batches of a pipeline stage accumulate into the unsharded gradient the
  // first one made.
  if (s.shard_gradients && (first || !keep_gathered()))
    mem(t, elems * compute_b_, Category::gradients, Phase::backward, g, mb);
}

// Reduction: per unit, or when the framework's bucket has filled.
void Simulation::queue_reduction(int u, double end, int mb) {
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
      !s.contiguous_grad_bucket;          // DDP caps buckets; FSDP reduces per unit
  const bool last = u == walking_.first;  // the backward's last unit
  if (!per_unit_buckets && pending_reduce_bytes_ < s.reduce_bucket_bytes && !last) return;
  if (reduces_after_backward() && !last) return;
  reduce_pending(u, end, mb);
}

// FSDP2's foreach_reduce copies the unsharded gradients into the flat input in the reduce dtype
// and clears them, then allocates the output shard on the reduce-scatter stream; the output
// becomes (or is added into) the kept sharded gradient. The input stays until the next group's
// copy-in, the last one until the backward's end (FSDPState._end_backward_iteration), after its
// reduce-scatter.
void Simulation::fsdp2_copy_in_buffers(int u, double end, double rs, double done, int mb) {
  reduce_input_done_ = done;
  reduce_input_held_ = pending_reduce_bytes_;
  mem(end, pending_reduce_bytes_, Category::buffers, Phase::reduce, u, mb);
  for (int pu : pending_units_)
    mem(end, -info(pu).params * compute_b_, Category::gradients, Phase::reduce, pu, mb);
  mem(rs, pending_reduce_bytes_ / shard_, Category::buffers, Phase::reduce, u, mb);
  mem(done, -pending_reduce_bytes_ / shard_, Category::buffers, Phase::reduce, u, mb);
  if (u == walking_.first) {
    mem(done, -reduce_input_held_, Category::buffers, Phase::reduce, u, mb);
    reduce_input_held_ = 0;
  }
}

// FSDP1's post-backward (torch/distributed/fsdp/_runtime_utils.py, _post_backward_hook and
// _reduce_grad): the flat gradient cast to the reduce dtype where it is another, beside the
// autograd one until the reduce-scatter is done; the output shard, in the reduce dtype, made
// before it (cast to the parameters' dtype after: reduce_pending's kept shard).
void Simulation::fsdp1_reduce_buffers(int u, double end, double rs, double done, int mb) {
  const double cast = reduce_b_ != compute_b_ ? pending_reduce_bytes_ : 0;
  mem(end, cast, Category::buffers, Phase::reduce, u, mb);
  mem(done, -cast, Category::buffers, Phase::reduce, u, mb);
  mem(rs, pending_reduce_bytes_ / shard_, Category::buffers, Phase::reduce, u, mb);
  mem(done, -pending_reduce_bytes_ / shard_, Category::buffers, Phase::reduce, u, mb);
}

// DeepSpeed's PipelineEngine reduces once every micro-batch's backward is done (ReduceGrads:
// reduce_gradients(pipeline_parallel=True), deepspeed/runtime/zero/stage_1_and_2.py), and that
// call appends a second bucket of reduce_bucket_size beside the one setup_buckets made at the
// first gradient hook; _release_ipg_buffers frees both with the last reduction (measured:
// tests/costmodel/data/oracle_deepspeed_pipeline.json, ZeRO 1 peaks at ReduceGrads).
void Simulation::pipeline_reduce_bucket(int u, double at, int mb) {
  if (second_bucket_ || !backward_bucket() || stage_.stages < 2 ||
      stage_.runner != documents::PipelineRunner::deepspeed ||
      spec_.flavour != documents::Flavour::deepspeed)
    return;
  mem(at, spec_.reduce_bucket_bytes, Category::buffers, Phase::reduce, u, mb);
  second_bucket_ = true;
}

// DeepSpeed's stage 0 (engine.py, allreduce_and_copy): each run of gradients flattened into a
// new tensor before its all-reduce and copied back after it (read and write, twice), the largest
// run's copy held through the reduction (freed by reduce_pending). Returns when the copies end.
double Simulation::flatten_to_reduce(int u, double end, int mb) {
  const double copies = 4 * pending_reduce_bytes_ / memory_Bps();
  const double st =
      issue(Stream::compute, end, Stream::compute, copies, "flatten and copy back", u);
  mem(st, flatten_run_bytes_, Category::buffers, Phase::reduce, u, mb);
  return st + copies;
}

// Reduces the pending gradients once unit u's backward ends: reduce-scatter or all-reduce, then
// HSDP's replica all-reduce and the offload's copy to the host; frees the unsharded gradients and
// keeps the shards.
void Simulation::reduce_pending(int u, double end, int mb) {
  const auto& s = spec_;
  const double S = shard_;
  const bool offload_opt = s.offload != Offload::none;
  const bool per_unit_buckets = !s.contiguous_grad_bucket;
  // DeepSpeed's stages 1/2 all-reduce the bucket and keep their partition of it.
  const Collective op = s.shard_optimizer && !s.all_reduce_partitions ? Collective::reduce_scatter
                                                                      : Collective::all_reduce;
  const Stream rs_stream =
      op == Collective::reduce_scatter ? Stream::reduce_scatter : Stream::all_reduce;
  const double dur = per_unit_buckets
                         ? bucketed(op, shard_group_, pending_reduce_bytes_, s.reduce_bucket_bytes)
                         : coll(op, shard_group_, pending_reduce_bytes_);
  const bool copy_in = s.reduce_copy_in && s.shard_gradients;
  if (flattens_to_reduce()) end = flatten_to_reduce(u, end, mb);
  // A main-gradient buffer reduced in another dtype is cast to it whole first (BF16_Optimizer's
  // fp32 buffer under bf16 communication: engine.py, allreduce_bucket), until the reduction ends.
  const double cast =
      frameworks_ && main_grad_buffer() && sb_.grad != reduce_b_ ? pending_reduce_bytes_ : 0.0;
  mem(end, cast, Category::buffers, Phase::reduce, u, mb);
  if (copy_in) {
    // FSDP2 keeps at most reduce_scatter_max_input_buffers (default 1) reduce-scatter inputs in
    // reduce_scatter_states: the next group's post_backward (FSDPParamGroup.post_backward) waits
    // for the previous reduce-scatter and drops its input before its own copy-in.
    end = issue(Stream::compute, reduce_input_done_, rs_stream, 0.0, "wait for reduce-scatter", u);
    mem(end, -reduce_input_held_, Category::buffers, Phase::reduce, u, mb);
  }
  const double rs = issue(rs_stream, end, Stream::compute, dur,
                          op == Collective::reduce_scatter ? "reduce-scatter" : "all-reduce", u);
  double done = rs + dur;  // when this bucket's gradients are fully reduced
  if (split_views() && s.shard_gradients) fsdp1_reduce_buffers(u, end, rs, rs + dur, mb);
  if (copy_in) fsdp2_copy_in_buffers(u, end, rs, rs + dur, mb);
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
    // ZeRO-1's whole gradients go as their bucket is reduced (Megatron's buffer and DeepSpeed's
    // stage 0 keep them for the step).
    if (reduces_after_backward() && !main_grad_buffer() && s.shard_optimizer) {
      mem(rs + dur, -pi.params * sb_.grad, Category::gradients, Phase::reduce, pu, mb);
      kept_grad_bytes_ -= pi.params * sb_.grad;
    }
    if (s.shard_gradients && !s.contiguous_grad_bucket && !copy_in)
      mem(rs + dur, -pi.params * compute_b_, Category::gradients, Phase::reduce, pu, mb);
    if (s.shard_gradients && !reduced_[pu] && !offload_opt && !persistent_flat_partition() &&
        !whole_partition_buffer()) {
      const double shard = pi.params / S * (s.flat_grad_partition ? flat_grad_b_ : sb_.grad);
      mem(rs + dur, shard, Category::gradients, Phase::reduce, pu, mb);
      kept_grad_bytes_ += shard;
    }
    reduced_[pu] = 1;
  }
  if (flattens_to_reduce())
    mem(rs + dur, -flatten_run_bytes_, Category::buffers, Phase::reduce, u, mb);
  mem(rs + dur, -cast, Category::buffers, Phase::reduce, u, mb);
  pipeline_reduce_bucket(u, rs, mb);
  // The backward's last reduction done, its buckets are released (_release_ipg_buffers).
  if (backward_bucket() && u == walking_.first) {
    mem(rs + dur, -s.reduce_bucket_bytes * (second_bucket_ ? 2 : 1), Category::buffers,
        Phase::reduce, u, mb);
    second_bucket_ = false;
  }
  pending_reduce_bytes_ = 0;
  pending_units_.clear();
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

bool Simulation::begin() {
  const auto& j = in_.job;
  result_.params = in_.model->total_params();
  result_.micro_batch = j.micro_batch;
  result_.capacity_bytes = in_.hardware->memory_bytes;
  if (!check_plan()) return false;
  prepare();
  result_.grad_accumulation = j.global_batch / world_ / j.micro_batch;
  states_ = place_states();  // present before the step starts
  if (states_) result_.rank_params = states_->total_params;
  return states_.has_value();
}

StepResult Simulation::run() {
  if (!begin()) return result_;
  const std::int64_t gas = result_.grad_accumulation;
  const FirstMicroBatch first = run_micro_batches(gas);
  double t = *std::max_element(free_at_.begin(), free_at_.end());
  wait_for_reductions();
  t = optimizer_step(t, *states_);
  // zero_grad(set_to_none=True): the gradients kept across micro-batches are released.
  mem(t, -kept_grad_bytes_, Category::gradients, Phase::optimizer, -1, 1);
  const double mb_tail = t - first.seconds;
  result_.step_s = gas > 1 ? first.seconds * static_cast<double>(gas - 1) + mb_tail : t;
  summarize(&first);
  return result_;
}

void Simulation::summarize(const FirstMicroBatch* first) {
  const auto& hw = *in_.hardware;
  const auto& j = in_.job;
  const std::int64_t gas = result_.grad_accumulation;
  walk_memory();
  account_states(*states_);
  add_overheads();
  account_compute(gas, first);
  double ring_per_mb = 0, tensor_per_mb = 0, fwd_flops_mb = 0;
  for (const Chunk& c : stage_.chunks)
    for (int u = c.first; u <= c.last; ++u) {
      const bool block = u > 0 && u < n_units_ - 1;
      if (context_ > 1 && block)
        ring_per_mb += ring_.forward_sent * (checkpointed(u) ? 2 : 1) + ring_.backward_sent;
      if (tensor_ > 1)
        tensor_per_mb += tensor_sent(u, TpPass::forward) + tensor_sent(u, TpPass::backward) +
                         (checkpointed(u) ? tensor_sent(u, TpPass::forward)
                          : j.checkpointing == documents::Checkpointing::selective_op && block
                              ? tensor_sent(u, TpPass::selective_rerun)
                              : 0.0);
      fwd_flops_mb += info(u).fwd_flops;
    }
  result_.context_bytes_per_gpu = ring_per_mb * static_cast<double>(gas);
  result_.tensor_bytes_per_gpu = tensor_per_mb * static_cast<double>(gas);
  result_.exposed_comm_s = std::max(0.0, result_.step_s - result_.compute_s - result_.bubble_s);
  const double tokens_step = static_cast<double>(j.global_batch * j.seq_len);
  result_.tokens_per_s = tokens_step / result_.step_s;
  // Model FLOPs: forward + backward (3× forward) without recompute, whole job (a stage's: its
  // share of the model on every replica).
  result_.model_flops = 3.0 * fwd_flops_mb * static_cast<double>(gas) * world_;
  result_.mfu = result_.model_flops / (result_.step_s * world_ * tensor_ * stage_.stages *
                                       hw.peak(compute_dtype(j.precision)));
}

}  // namespace step_walk

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
  case Stream::tensor:
    return "tensor parallel";
  }
  return "?";
}

StepResult simulate_step(const StepInput& in, Trace* trace) {
  const int c = in.context_parallel;
  if (c <= 1) {
    step_walk::Simulation sim(in, trace);
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
  step_walk::Simulation sim(rank, trace);
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
