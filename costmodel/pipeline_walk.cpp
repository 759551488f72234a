#include "costmodel/pipeline_walk.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "costmodel/parallel_memory.hpp"
#include "costmodel/parallel_step.hpp"
#include "costmodel/simulation.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"
#include "documents/parallel.hpp"
#include "documents/recipe.hpp"

namespace shardplan::costmodel {

using documents::Category;
using documents::Collective;
using documents::ParallelLayout;
using documents::PipeOp;
using documents::PipeOpKind;

namespace step_walk {

namespace {

// What the code that runs a pipeline's stages keeps around one micro-batch's forward and backward
// through a chunk, beyond what its units keep; [T, h] tensors split by t under sequence
// parallelism, in the dtype the activations are kept in.
struct StageBuffers {
  bool logits = false;          // the output [T, V/t], from the forward to the backward's end
  bool chunk_output = false;    // the output [T, h] in its pending send, the same
  bool incoming = false;        // the output's gradient [T, h] received, through the backward
  bool input_gradient = false;  // the input's gradient [T, h] sent back, until waited on:
  bool sends_at_end = false;    //   at the schedule's end, else before the next backward's send
  bool input_held = false;      // the received input [T, h] past the backward, to the step's end
  bool exchange = false;        // the output sent beside the next input received, at its end
  bool batch = false;           // the micro-batch's int32 tokens and targets, forward to backward
  // DeepSpeed's PipelineEngine:
  bool receive_buffer = false;  // one [T, h] buffer receiving activations or gradients, kept
  bool input_clone = false;     // the received input's clone, forward's start to backward's end
  bool output_slots = false;    // the last stage's slots keep logits, input and its gradient
  bool id_slots = false;        // the first stage's slots keep the micro-batch's int64 token ids
};

// torch.distributed.pipelining (torch/distributed/pipelining/stage.py, schedules.py):
//   the last virtual stage's logits: forward_one_chunk keeps its output in _forward_chunk_states
//     until backward_one_chunk has run (_output_slot_is_releasable refuses the last stage's)
//   with model chunks, a chunk's output: the runtime's SEND_F keeps it in the pending send,
//     waited on after the same chunk's backward of that micro-batch
//   the output's gradient from the next virtual stage (get_bwd_recv_ops)
//   the input's gradient sent back (get_bwd_send_ops): under 1F1B waited on before the next
//     backward's send; under GPipe (ScheduleGPipe._step_microbatches collects bwd_sends_to_wait)
//     and with chunks at the schedule's end
//   the received input, a leaf of the micro-batch's graph, to the step's end on the last virtual
//     stage (the schedule keeps each micro-batch's loss, and with it the graph, in
//     _internal_losses, and torchtitan's train step holds their sum until after the optimizer
//     step); another virtual stage lets go of it when its backward returns (backward_one_chunk
//     pops _forward_chunk_states)
// Megatron's schedules (megatron/core/pipeline_parallel/schedules.py): the output's gradient
//   received (recv_backward) through the backward; the output itself is released once sent
//   (deallocate_output_tensor) and the input is the first block's own.
// DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py, 0.19.8; measured:
//   tests/costmodel/data/oracle_deepspeed_pipeline.json):
//   one zeros buffer from _allocate_or_extend_buffers, the activations' receive buffer
//     (pipe_recv_buf) and the gradients' (grad_layer) at once, made in the first step and kept
//   _exec_recv_activations clones the received tensor into the micro-batch's slot
//     (pipe_buffers['inputs']) and _exec_forward_pass runs on a second clone (the first block's
//     own input): the slot's is extra, with its gradient, until SendGrad drops it
//   a stage's output in pipe_buffers['outputs'] from the forward to its backward, which clears it
//   the last stage's _exec_backward_pass returns before clearing its slot: each of its
//     num_pipe_buffers = 2 slots (TrainSchedule.num_pipe_buffers) keeps its micro-batch's logits,
//     and through their graph the received input and its gradient, until the micro-batch two
//     later is assigned to it, across steps
//   _exec_load_micro_batch keeps the first stage's token ids (int64) in its slots, across steps
// The executor's trainer (executor/pipeline.cpp): its output sent while the next micro-batch's
//   input arrives into a buffer of its own; the last stage keeps the micro-batch's int32 tokens
//   and targets (the first stage's are its embeddings': embedding_activations); its blocks count
//   the incoming gradient in their own backward (executor_tensors' dy).
StageBuffers stage_buffers(documents::PipelineRunner runner, bool framework, const Chunk& c,
                           int units, bool chunks, bool gpipe) {
  using documents::PipelineRunner;
  const bool first = c.first == 0, last = c.last == units - 1;
  StageBuffers b;
  if (!framework || runner == PipelineRunner::executor) {
    b.exchange = !last;
    b.batch = last && !first;
    return b;
  }
  if (runner == PipelineRunner::deepspeed) {
    b.receive_buffer = true;
    b.input_clone = !first && !last;
    b.chunk_output = !last;
    b.output_slots = last && !first;
    b.id_slots = first;
    return b;
  }
  b.incoming = !last;
  if (runner != PipelineRunner::torch_pipelining) return b;
  b.logits = last;
  b.chunk_output = chunks && !last;
  b.input_gradient = !first;
  b.sends_at_end = chunks || gpipe;
  b.input_held = !first && last;
  return b;
}

}  // namespace

double Simulation::stage_op(const PipeOp& op, double ready, bool first, bool last) {
  const Chunk& c = stage_.chunks.at(static_cast<std::size_t>(op.chunk));
  const StageBuffers b =
      stage_buffers(stage_.runner, frameworks_, c, n_units_, stage_.chunks.size() > 1,
                    stage_.schedule == documents::PipelineSchedule::gpipe);
  const int mb = op.micro_batch;
  if (ready > free_at_[0]) {
    result_.bubble_s += ready - free_at_[0];
    free_at_[0] = ready;
  }
  const double start = free_at_[0];
  const auto& m = *in_.model;
  const double T =
      static_cast<double>(in_.job.seq_len) / context_ * static_cast<double>(in_.job.micro_batch);
  const double x = act_b_ * T * static_cast<double>(m.hidden) / (sequence_parallel_ ? tensor_ : 1);
  // Kept to the end of the backward: from the forward's start, and from its end.
  const double batch = b.batch ? 8 * T : 0;
  const double output = (b.logits ? act_b_ * T * static_cast<double>(m.vocab) / tensor_ : 0) +
                        (b.chunk_output ? x : 0);
  // DeepSpeed's last stage: what one slot keeps (its logits, the received input, its gradient).
  const double logits_b = documents::dtype_bytes(documents::compute_dtype(in_.job.precision));
  const double slot =
      b.output_slots ? logits_b * T * static_cast<double>(m.vocab) / tensor_ + 2 * x : 0;
  if (!pipe_held_) {  // kept from the step before: its slots and the receive buffer
    pipe_held_ = true;
    const double slots = static_cast<double>(std::min<std::int64_t>(2, result_.grad_accumulation));
    mem(start, (b.receive_buffer ? x : 0) + slots * slot + (b.id_slots ? slots * 8 * T : 0),
        Category::activations, Phase::forward, c.first, mb);
  }
  if (op.kind == PipeOpKind::forward) {
    mem(start, batch + (b.input_clone || b.output_slots ? x : 0), Category::activations,
        Phase::forward, c.last, mb);
    forward(mb, c);
    const double end = free_at_[0];
    mem(end, output, Category::activations, Phase::forward, c.last, mb);
    if (b.output_slots) {  // the logits take the slot, whose micro-batch of two before goes
      mem(end, slot - 2 * x, Category::activations, Phase::forward, c.last, mb);
      mem(end, -slot, Category::activations, Phase::forward, c.last, mb);
    }
    if (b.exchange) {
      const double both = 2 * act_b_ * T * static_cast<double>(m.hidden);
      mem(end, both, Category::activations, Phase::forward, c.last, mb);
      mem(end, -both, Category::activations, Phase::forward, c.last, mb);
    }
    return end;
  }
  mem(start, b.incoming ? x : 0, Category::activations, Phase::backward, c.last, mb);
  // DeepSpeed's engine reduces after the whole backward (ReduceGrads), once the stage has let go
  // of the output and taken the input's gradient.
  const bool reduce_grads = last && stage_.runner == documents::PipelineRunner::deepspeed &&
                            spec_.flavour == documents::Flavour::deepspeed;
  backward(mb, first, last && !reduce_grads, c);
  const double end = free_at_[0];
  mem(end, -(batch + output + (b.incoming ? x : 0)), Category::activations, Phase::backward, c.last,
      mb);
  if (b.input_gradient) {
    if (!b.sends_at_end) {  // the previous one's send is waited on now
      mem(end, -pending_send_, Category::activations, Phase::backward, c.first, mb);
      pending_send_ = 0;
    }
    mem(end, x, Category::activations, Phase::backward, c.first, mb);
    pending_send_ += x;
  }
  if (b.input_held) {
    mem(end, x, Category::activations, Phase::backward, c.first, mb);
    held_to_end_ += x;
  }
  // The received input's gradient: SendGrad drops it with the input (the last stage's slot keeps
  // both).
  if (b.input_clone || b.output_slots)
    mem(end, x, Category::activations, Phase::backward, c.first, mb);
  if (b.input_clone) mem(end, -2 * x, Category::activations, Phase::backward, c.first, mb);
  if (reduce_grads) {
    // setup_buckets' bucket, made at the backward's first gradient hook, is still there.
    if (backward_bucket())
      mem(end, spec_.reduce_bucket_bytes, Category::buffers, Phase::reduce, c.first, mb);
    for (int u = c.last; u >= c.first; --u) queue_reduction(u, end, mb);
  }
  return end;
}

StepResult Simulation::finish(double after_reduce, double after_reduce_bytes) {
  double t = *std::max_element(free_at_.begin(), free_at_.end());
  wait_for_reductions();
  mem(t, -pending_send_, Category::activations, Phase::backward, -1, 1);
  if (after_reduce > 0) {
    const double st = issue(Stream::all_reduce, t, Stream::compute, after_reduce,
                            "tied embedding all-reduce", -1);
    result_.comm_bytes_per_gpu += after_reduce_bytes;
    result_.comm_bytes_by_op[static_cast<int>(Collective::all_reduce)] += after_reduce_bytes;
    if (!in_.hardware->collectives_block)
      result_.exposed_s[static_cast<int>(Stream::all_reduce)] += after_reduce;
    free_at_[0] = t = st + after_reduce;
  }
  t = optimizer_step(t, *states_);
  mem(t, -kept_grad_bytes_, Category::gradients, Phase::optimizer, -1, 1);
  mem(t, -held_to_end_, Category::activations, Phase::optimizer, -1, 1);
  result_.step_s = t;
  summarize(nullptr);
  return result_;
}

}  // namespace step_walk

namespace {

// The units of stage s: chunk k is virtual stage k·p + s, its blocks pipeline_parts' share.
step_walk::StageUnits stage_units(const StepInput& in, const ParallelLayout& l, int s) {
  const int p = l.pipeline_parallel;
  const auto parts = documents::pipeline_parts(l, in.model->layers);
  const int last_unit = static_cast<int>(in.model->layers) + 1;
  step_walk::StageUnits out;
  out.stages = p;
  out.runner = documents::recipe_traits(in.job.recipe).pipeline;
  out.schedule = l.schedule;
  for (int k = 0; k < l.virtual_stages; ++k) {
    const auto vs =
        static_cast<std::size_t>(k) * static_cast<std::size_t>(p) + static_cast<std::size_t>(s);
    std::int64_t first_block = 0;
    for (std::size_t i = 0; i < vs; ++i) first_block += parts[i];
    step_walk::Chunk c{static_cast<int>(first_block) + 1,
                       static_cast<int>(first_block + parts[vs])};
    if (vs == 0) c.first = 0;
    if (vs + 1 == parts.size()) c.last = last_unit;
    out.chunks.push_back(c);
  }
  return out;
}

// A point-to-point send of `bytes` between two stages: one hop's latency and the link's bandwidth.
double p2p_seconds(const documents::HardwareProfile& hw, bool inter_node, double bytes) {
  if (bytes <= 0) return 0;
  return inter_node ? hw.inter_latency_s + bytes / hw.inter_bandwidth_Bps
                    : hw.intra_latency_s + bytes / hw.intra_bandwidth_Bps;
}

// Runs every stage's ops, each once what it waits for has ended: the previous virtual stage's
// forward of the micro-batch or the next one's backward, a send away, or (the last virtual
// stage's backward) its own forward. Records the chunks each stage holds at once. False when a
// stage waits for an op no stage runs.
bool run_ops(std::vector<std::unique_ptr<step_walk::Simulation>>& sims,
             const std::vector<std::vector<PipeOp>>& ops, const ParallelLayout& l,
             PipelineStages& out) {
  const int p = l.pipeline_parallel, v = l.virtual_stages, m = l.micro_batches;
  const int virtual_stages = p * v;
  // When each virtual stage's forward and backward of each micro-batch end (−1: not yet run).
  std::vector<double> fwd_end(
      static_cast<std::size_t>(virtual_stages) * static_cast<std::size_t>(m), -1.0);
  std::vector<double> bwd_end = fwd_end;
  auto at = [&](int vs, int mb) {
    return static_cast<std::size_t>(vs) * static_cast<std::size_t>(m) +
           static_cast<std::size_t>(mb);
  };
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<int> backwards(static_cast<std::size_t>(virtual_stages), 0);  // run so far
  std::vector<int> alive(static_cast<std::size_t>(p), 0);
  out.walk.peak_chunks.assign(static_cast<std::size_t>(p), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < p; ++s) {
      const auto si = static_cast<std::size_t>(s);
      for (; next[si] < ops[si].size(); ++next[si]) {
        const PipeOp& op = ops[si][next[si]];
        const int vs = op.chunk * p + s;
        const bool fwd = op.kind == PipeOpKind::forward;
        const bool crosses = fwd ? vs > 0 : vs + 1 < virtual_stages;
        const double ready = !crosses ? (fwd ? 0 : fwd_end[at(vs, op.micro_batch)])
                             : fwd    ? fwd_end[at(vs - 1, op.micro_batch)]
                                      : bwd_end[at(vs + 1, op.micro_batch)];
        if (ready < 0) break;
        int& done = backwards[static_cast<std::size_t>(vs)];
        const double end = sims[si]->stage_op(op, ready + (crosses ? out.p2p_s : 0), done == 0,
                                              !fwd && done == m - 1);
        (fwd ? fwd_end : bwd_end)[at(vs, op.micro_batch)] = end;
        if (!fwd) ++done;
        alive[si] += fwd ? 1 : -1;
        out.walk.peak_chunks[si] = std::max(out.walk.peak_chunks[si], alive[si]);
        progressed = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    if (next[static_cast<std::size_t>(s)] < ops[static_cast<std::size_t>(s)].size()) return false;
  return true;
}

}  // namespace

double pipeline_step_bound(const StepInput& rank, const ParallelLayout& l) {
  const int p = l.pipeline_parallel, v = l.virtual_stages;
  const double e = documents::dtype_bytes(documents::compute_dtype(rank.job.precision));
  const double p2p =
      p2p_seconds(*rank.hardware, layout_groups(l, rank.cluster).pipeline_crosses_nodes,
                  p2p_bytes(*rank.model, rank.job, l, e));
  // Stage s runs all its ops, each no shorter than its compute alone, after the first
  // micro-batch's forward has reached it through chunk 0 of every stage before it, and its last
  // op (a backward of chunk 0's virtual stage or one after it) is followed by that micro-batch's
  // backward through the stages before it, a send between each two.
  double bound = 0, before = 0;  // the smallest forward and backward of the stages before s
  for (int s = 0; s < p; ++s) {
    step_walk::Simulation sim(rank, nullptr, stage_units(rank, l, s));
    if (!sim.begin()) return 0;
    double busy = 0, smallest = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < static_cast<std::size_t>(v); ++k) {
      const double f = sim.chunk_seconds(k, false), b = sim.chunk_seconds(k, true);
      busy += l.micro_batches * (f + b);
      smallest = std::min(smallest, f + b);
    }
    bound = std::max(bound, before + 2 * s * p2p + busy);
    before += smallest;
  }
  return bound;
}

PipelineStages walk_pipeline(const StepInput& rank, const ParallelLayout& l) {
  PipelineStages out;
  const int p = l.pipeline_parallel, v = l.virtual_stages;
  const auto& hw = *rank.hardware;
  std::vector<std::unique_ptr<step_walk::Simulation>> sims;
  for (int s = 0; s < p; ++s) {
    sims.push_back(std::make_unique<step_walk::Simulation>(rank, nullptr, stage_units(rank, l, s)));
    if (!sims.back()->begin()) {
      const StepResult& r = sims.back()->result();
      out.valid = false;
      out.reason = r.reason;
      out.reason_input = r.reason_input;
      out.stages.push_back(r);
      return out;
    }
  }
  const ParallelMemoryInput mi{rank.model, rank.hardware, rank.cluster, rank.job, rank.spec, l};
  const auto ops = stage_orders(mi);
  const double e = documents::dtype_bytes(documents::compute_dtype(rank.job.precision));
  out.p2p_bytes = p2p_bytes(*rank.model, rank.job, l, e);
  out.p2p_s = p2p_seconds(hw, layout_groups(l, rank.cluster).pipeline_crosses_nodes, out.p2p_bytes);
  if (!run_ops(sims, ops, l, out)) {
    out.valid = false;
    out.reason = "a stage's schedule waits for an op no stage runs";
    out.reason_input = "--schedule";
    return out;
  }
  // A tied table's gradient summed between the first and the last stage (Megatron-core's
  // _allreduce_word_embedding_grads; torchtitan ties none under a pipeline).
  const auto tied = tied_embedding_allreduce(rank, l);
  out.embedding_allreduce_s = tied.seconds;
  out.embedding_bytes = tied.bytes_sent;
  for (int s = 0; s < p; ++s) {
    const auto si = static_cast<std::size_t>(s);
    const bool ends = s == 0 || s == p - 1;
    const StepResult r = sims[si]->finish(ends ? tied.seconds : 0, ends ? tied.bytes_sent : 0);
    out.walk.end_s.push_back(r.step_s - r.optimizer_s);
    out.walk.busy_s.push_back(out.walk.end_s.back() - r.bubble_s);  // its ops, their waits
    out.walk.peak_in_flight.push_back(static_cast<double>(out.walk.peak_chunks[si]) / v);
    out.stages.push_back(r);
  }
  out.walk.span_s = *std::max_element(out.walk.end_s.begin(), out.walk.end_s.end());
  const double busiest = *std::max_element(out.walk.busy_s.begin(), out.walk.busy_s.end());
  out.walk.bubble_fraction = busiest > 0 ? (out.walk.span_s - busiest) / busiest : 0;
  return out;
}

}  // namespace shardplan::costmodel
