#include "costmodel/parallel_step.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "costmodel/compute_time.hpp"
#include "costmodel/pipeline_walk.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"
#include "documents/workload.hpp"

namespace shardplan::costmodel {

using documents::block_forward_flops_per_token;
using documents::bytes_sent_per_rank;
using documents::Category;
using documents::Checkpointing;
using documents::Collective;
using documents::compute_dtype;
using documents::dtype_bytes;
using documents::Flavour;
using documents::HardwareProfile;
using documents::head_forward_flops_per_token;
using documents::layout_problems;
using documents::ModelSpec;
using documents::Offload;
using documents::ParallelLayout;
using documents::recipe_traits;
using documents::reduces_after_backward;
using documents::stage_blocks;
using documents::stage_first_block;
using documents::state_bytes;
using documents::StateBytes;
using documents::TensorParallelCode;
using documents::Tier;
using documents::TpLoss;
using documents::TrainingJob;
using documents::UnitKind;
namespace {

double local_tokens(const TrainingJob& j, const ParallelLayout& l) {
  return static_cast<double>(j.seq_len) / l.context_parallel * static_cast<double>(j.micro_batch);
}

// A point-to-point send of `bytes` on a group's tier: one hop's latency and the link's bandwidth.
double p2p_time(const HardwareProfile& hw, Tier tier, double bytes) {
  if (bytes <= 0) return 0;
  return tier == Tier::inter_node ? hw.inter_latency_s + bytes / hw.inter_bandwidth_Bps
                                  : hw.intra_latency_s + bytes / hw.intra_bandwidth_Bps;
}

// One stage's seconds per micro-batch: compute alone, and forward/backward with what is exposed.
struct StageTime {
  double compute = 0;                // forward + backward + recompute kernels
  ComputeTimes kinds{};              // the same by kind (compute_time.hpp)
  double forward = 0, backward = 0;  // with exposed TP and CP communication
  double tp_exposed = 0, cp_exposed = 0;
};

// Per-block times and communication, shared by every block of the stage.
struct BlockTime {
  double fwd = 0, bwd = 0;  // the block's kernels on the rank and the host's issuing (rank_unit)
  ComputeTimes kinds{};     // fwd + bwd by kind
  double core_fwd = 0;      // the attention core of the forward (what ring attention overlaps)
  double tp_fwd = 0, tp_bwd = 0;  // TP collectives' seconds
  double cp_fwd = 0, cp_bwd = 0;  // ring exchanges' seconds
  // torchtitan's op-level selective checkpointing reruns every second matmul of its save list,
  // the attention output projection (wo) and the MLP's up projection (w3), and the element-wise
  // ops its save list omits, before the backward (block_recompute on the rank).
  double selective = 0;
  // Its rerun under tensor parallelism reruns the forward's collectives up to the MLP's last
  // input (non-reentrant checkpointing stops once the tensors backward needs exist): both
  // all-gathers and the attention's reduce-scatter under sequence parallelism, the attention's
  // all-reduce without; the policy saves no output of them.
  double tp_selective = 0;
};

// One unit's seconds per micro-batch on a rank of the layout, as the step walk times a unit
// (simulator_setup.cpp, compute_time.hpp): its GEMMs, attention and element-wise ops on the rank's
// T = s/c·b tokens, split over the t tensor-parallel ranks (TensorSplit), and the host's issuing
// of their kernels with the engine's hooks.
struct RankUnit {
  double forward = 0, backward = 0;
  ComputeTimes kinds{};          // forward + backward by kind
  double attention_forward = 0;  // of forward, the attention core
  double recompute = 0;          // a block's rerun under selective checkpointing
};

RankUnit rank_unit(const StepInput& in, const ParallelLayout& l, const ComputeModel& cm,
                   UnitKind unit) {
  const auto& m = *in.model;
  const auto& hw = *in.hardware;
  TrainingJob rank_job = in.job;
  rank_job.seq_len = in.job.seq_len / l.context_parallel;
  const auto& traits = recipe_traits(rank_job.recipe);
  const StateBytes sb = state_bytes(in.job.precision, in.spec, in.accounting);
  // DDP over fp32 parameters computing in a 16-bit dtype reads them in fp32 (autocast's casts,
  // the executor's copies); every other engine hands the forward 16-bit parameters.
  const bool ddp_mixed = in.spec.flavour == Flavour::ddp && sb.compute < sb.param;
  const Forward f{sb.compute, ddp_mixed ? sb.param : sb.compute, !hw.is_cpu};
  const TensorSplit split{l.tensor_parallel, l.sequence_parallel,
                          traits.tensor_parallel != TensorParallelCode::torch_styles ||
                              traits.tp_loss == TpLoss::loss_parallel};
  const int context = unit == UnitKind::block ? l.context_parallel : 1;
  const UnitWork w = unit_work(cm, m, rank_job, unit, f, context, split);
  HostWork h;
  if (traits.framework) {
    const auto& tensors = unit == UnitKind::block  ? m.block
                          : unit == UnitKind::head ? m.head
                                                   : m.embedding;
    h = unit_host_work(hw, framework_key(in.spec), w, tensors);
  }
  RankUnit r;
  r.forward = unit_seconds(hw, w.forward, h.forward_s, r.kinds);
  r.backward = unit_seconds(hw, w.backward, h.backward_s, r.kinds);
  r.attention_forward = w.forward[static_cast<int>(ComputeKind::attention)];
  if (unit == UnitKind::block) {
    const ComputeTimes rerun = block_recompute(cm, m, rank_job, f, split);
    r.recompute = std::accumulate(rerun.begin(), rerun.end(), 0.0);
  }
  return r;
}

BlockTime block_time(const StepInput& in, const ParallelLayout& l, const LayoutGroups& g,
                     const ComputeModel& cm) {
  const auto& m = *in.model;
  const auto& j = in.job;
  const double e = dtype_bytes(compute_dtype(j.precision));
  const double T = local_tokens(j, l);
  const double t = l.tensor_parallel;
  BlockTime b;
  // Each rank runs its share of every GEMM and of the heads; its T local tokens attend over the
  // whole sequence (ring attention visits every K/V chunk).
  const RankUnit block = rank_unit(in, l, cm, UnitKind::block);
  b.fwd = block.forward;
  b.bwd = block.backward;
  b.kinds = block.kinds;
  b.core_fwd = block.attention_forward;
  if (j.checkpointing == Checkpointing::selective_op) b.selective = block.recompute;
  const CommModel comm(*in.hardware);
  const double buffer = e * T * static_cast<double>(m.hidden);
  auto tp_phase = [&]() {
    if (l.tensor_parallel == 1) return 0.0;
    if (!l.sequence_parallel)
      return 2 * comm.cost(Collective::all_reduce, g.tensor, buffer).seconds;
    return 2 * (comm.cost(Collective::all_gather, g.tensor, buffer).seconds +
                comm.cost(Collective::reduce_scatter, g.tensor, buffer).seconds);
  };
  b.tp_fwd = b.tp_bwd = tp_phase();
  if (j.checkpointing == Checkpointing::selective_op && l.tensor_parallel > 1)
    b.tp_selective = l.sequence_parallel
                         ? 2 * comm.cost(Collective::all_gather, g.tensor, buffer).seconds +
                               comm.cost(Collective::reduce_scatter, g.tensor, buffer).seconds
                         : comm.cost(Collective::all_reduce, g.tensor, buffer).seconds;
  if (l.context_parallel > 1) {
    const double chunk = 2 * e * T * static_cast<double>(m.kv_width()) / t;  // K and V
    const double step = p2p_time(*in.hardware, g.context.tier(), chunk);
    b.cp_fwd = (l.context_parallel - 1) * step;
    b.cp_bwd = (l.context_parallel - 1) * p2p_time(*in.hardware, g.context.tier(), 2 * chunk);
    // The executor's dK, dV take one more hop home after the last block (context_parallel.hpp).
    if (!recipe_traits(in.job.recipe).framework)
      b.cp_bwd += p2p_time(*in.hardware, g.context.tier(), chunk);
  }
  return b;
}

// Async TP overlaps each collective with the GEMMs beside it: exposed only beyond them.
double exposed(double comm, double overlap_with, bool overlapped) {
  return overlapped ? std::max(0.0, comm - overlap_with) : comm;
}

// Stage s's compute per micro-batch: its blocks (documents::stage_blocks; the first one's index
// says which of them every:N checkpoints) and, on the last, the head.
StageTime stage_time(const StepInput& in, const ParallelLayout& l, const BlockTime& b, int stage,
                     const ComputeModel& cm) {
  const auto& m = *in.model;
  const auto& j = in.job;
  const double blocks = static_cast<double>(stage_blocks(l, m.layers, stage));
  const std::int64_t first_block = stage_first_block(l, m.layers, stage);
  const bool last = stage == l.pipeline_parallel - 1;
  const bool async = l.async_tensor_parallel;
  StageTime s;
  const double tp_f = exposed(b.tp_fwd, b.fwd - b.core_fwd, async);
  const double tp_b = exposed(b.tp_bwd, b.bwd - 2 * b.core_fwd, async) +
                      exposed(b.tp_selective, b.selective, async);
  // Ring attention overlaps each exchange with the attention of the block in hand (Transformer
  // Engine's, torch's context_parallel); the executor's ring waits for each exchange
  // (executor/context_parallel.hpp).
  const bool ring_overlapped = recipe_traits(j.recipe).framework;
  const double cp_f = exposed(b.cp_fwd, b.core_fwd, ring_overlapped);
  const double cp_b = exposed(b.cp_bwd, 2 * b.core_fwd, ring_overlapped);
  double checkpointed = 0;
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(blocks); ++k)
    checkpointed += j.block_checkpointed(first_block + k) ? 1 : 0;
  // A checkpointed block reruns its forward, its collectives included, before its backward.
  s.forward = blocks * (b.fwd + tp_f + cp_f);
  s.backward = blocks * (b.bwd + tp_b + cp_b + b.selective) + checkpointed * (b.fwd + tp_f + cp_f);
  s.compute = blocks * (b.fwd + b.bwd + b.selective) + checkpointed * b.fwd;
  s.tp_exposed = blocks * (tp_f + tp_b) + checkpointed * tp_f;
  s.cp_exposed = blocks * (cp_f + cp_b) + checkpointed * cp_f;
  for (int k = 0; k < kComputeKinds; ++k) s.kinds[k] = blocks * b.kinds[k];
  s.kinds[static_cast<int>(ComputeKind::recompute)] += blocks * b.selective + checkpointed * b.fwd;
  // The head on the last stage, the embeddings on the first, as the step walk times them.
  for (const UnitKind unit : {UnitKind::embedding, UnitKind::head}) {
    if (unit == UnitKind::embedding ? stage != 0 : !last) continue;
    const RankUnit u = rank_unit(in, l, cm, unit);
    s.forward += u.forward;
    s.backward += u.backward;
    s.compute += u.forward + u.backward;
    for (int k = 0; k < kComputeKinds; ++k) s.kinds[k] += u.kinds[k];
  }
  return s;
}

// The data-parallel side of a stage: gradient reduction over the DP (and CP) group after the
// stage's last backward (overlapped with that backward), ZeRO-1/2's parameter all-gather after the
// optimizer step, FSDP's parameter all-gathers; then the optimizer step, bandwidth-bound over the
// local shard. Returns the seconds from the stage's last backward to the end of its optimizer step.
struct DataParallelTime {
  double comm = 0, exposed = 0, bytes = 0, optimizer = 0;
};

DataParallelTime data_parallel_time(const StepInput& in, const ParallelLayout& l,
                                    const LayoutGroups& g, const StageMemory& mem,
                                    const StageTime& st) {
  const auto& s = in.spec;
  const auto& hw = *in.hardware;
  const CommModel comm(hw);
  const StateBytes sb = state_bytes(in.job.precision, s, Accounting::framework);
  const double reduce_b = std::max(dtype_bytes(s.reduce_dtype), sb.compute);
  DataParallelTime d;
  auto run = [&](Collective op, double size) {
    const auto c = comm.cost(op, g.data_context, size);
    d.bytes += c.bytes_sent;
    return c.seconds;
  };
  const double grads = mem.local_params * reduce_b;
  const double reduce =
      run(s.shard_optimizer ? Collective::reduce_scatter : Collective::all_reduce, grads);
  d.comm += reduce;
  // Beside the last micro-batch's backward, or after it (documents::reduces_after_backward).
  d.exposed += reduces_after_backward(s) ? reduce : std::max(0.0, reduce - st.backward);
  const double params = mem.local_params * sb.compute;
  if (s.shard_optimizer && !s.shard_parameters) {  // ZeRO-1/2: gather the updated parameters
    const double ag = run(Collective::all_gather, params);
    d.comm += ag;
    d.exposed += ag;
  }
  if (s.shard_parameters) {
    // Under a pipeline the stage's parameters are gathered once, before its first forward, and
    // kept for the step; without one FSDP gathers every unit in each forward and backward,
    // overlapped with the compute but for the first unit of each pass.
    const bool pipeline = l.pipeline_parallel > 1;
    const double times = pipeline ? 1.0 : 2.0 * l.micro_batches;
    const auto c = comm.cost(Collective::all_gather, g.data_context, params);
    d.bytes += c.bytes_sent * times;
    d.comm += c.seconds * times;
    const double first_unit = c.seconds / std::max(1.0, static_cast<double>(in.model->layers));
    d.exposed += pipeline ? c.seconds
                          : std::max(0.0, c.seconds * times - st.compute * l.micro_batches) +
                                times * first_unit;
  }
  // Read the gradient shard, read and write the fp32 master and the moments, write the parameters:
  // the stage's sharded states moved once each way.
  const double bw = hw.calibration && hw.calibration->memory_bandwidth_Bps
                        ? *hw.calibration->memory_bandwidth_Bps
                        : hw.hbm_bandwidth_Bps;
  d.optimizer = (2 * mem.optimizer_bytes + mem.grad_bytes + mem.param_bytes) / bw;
  return d;
}

}  // namespace

// Tied word embeddings under a pipeline: the first stage's table and the last stage's copy (the
// head) each collect a gradient, which Megatron-core sums over the embedding group (the first and
// last stages' ranks at the same data, context and tensor position) after the data-parallel
// reduction and before the optimizer step (megatron/core/distributed/finalize_model_grads.py,
// finalize_model_grads then _allreduce_word_embedding_grads): an all-reduce of 2 ranks over the
// v·h/t elements of the vocabulary-split table, in the gradients' reduce dtype; nothing runs beside
// it. Empty when the model does not tie them or there is one stage.
CollectiveCost tied_embedding_allreduce(const StepInput& in, const ParallelLayout& l) {
  const auto& m = *in.model;
  if (!m.tied_embeddings || l.pipeline_parallel < 2) return {};
  const StateBytes sb = state_bytes(in.job.precision, in.spec, Accounting::framework);
  const double reduce_b = std::max(dtype_bytes(in.spec.reduce_dtype), sb.compute);
  const double elements =
      static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / l.tensor_parallel;
  // The two ranks are (p − 1)·t·c·d apart in the mesh order (parallel_layout.hpp).
  const std::int64_t apart = static_cast<std::int64_t>(l.pipeline_parallel - 1) *
                             l.tensor_parallel * l.context_parallel *
                             std::max(1, l.data_parallel(in.cluster.gpus));
  const Group pair{2, apart >= in.cluster.gpus_per_node ? 1 : 2};
  return CommModel(*in.hardware).cost(Collective::all_reduce, pair, elements * reduce_b);
}

double tp_bytes_per_block(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l,
                          double e) {
  const int n = l.tensor_parallel;
  if (n <= 1) return 0;
  const double buffer = e * local_tokens(j, l) * static_cast<double>(m.hidden);
  const double one = l.sequence_parallel
                         ? bytes_sent_per_rank(Collective::all_gather, n, buffer) +
                               bytes_sent_per_rank(Collective::reduce_scatter, n, buffer)
                         : bytes_sent_per_rank(Collective::all_reduce, n, buffer);
  return 4 * one;  // two in the forward, two in the backward
}

double cp_bytes_per_block(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l,
                          double e) {
  const double c = l.context_parallel;
  if (c <= 1) return 0;
  const double chunk =
      2 * e * local_tokens(j, l) * static_cast<double>(m.kv_width()) / l.tensor_parallel;
  return (c - 1) * chunk * 3;  // forward: K, V; backward: K, V and dK, dV
}

double p2p_bytes(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l, double e) {
  const double split = l.sequence_parallel ? l.tensor_parallel : 1;
  return e * local_tokens(j, l) * static_cast<double>(m.hidden) / split;
}

}  // namespace shardplan::costmodel

namespace shardplan::costmodel {
namespace {

// The per-stage times, the walk, the data-parallel tail and the memory, summed up.
void evaluate_stages(const StepInput& in, const ParallelLayout& l, ParallelStep& out) {
  const auto& m = *in.model;
  const auto& j = in.job;
  const auto& hw = *in.hardware;
  const int p = l.pipeline_parallel;
  const double e = dtype_bytes(compute_dtype(j.precision));
  const LayoutGroups g = layout_groups(l, in.cluster);
  const ComputeModel cm(hw, j);
  const BlockTime b = block_time(in, l, g, cm);
  std::vector<StageTime> st;
  for (int s = 0; s < p; ++s) {
    st.push_back(stage_time(in, l, b, s, cm));
    out.stage_forward_s.push_back(st.back().forward);
    out.stage_backward_s.push_back(st.back().backward);
  }
  out.p2p_s = p2p_time(hw, g.pipeline_crosses_nodes ? Tier::inter_node : Tier::intra_node,
                       p2p_bytes(m, j, l, e));
  ParallelMemoryInput mi{&m, &hw, in.cluster, j, in.spec, l};
  // Time and memory walk the one order the recipe's pipeline runs (stage_orders).
  out.walk = walk_ops(stage_orders(mi), p, l.virtual_stages, l.micro_batches, out.stage_forward_s,
                      out.stage_backward_s, p > 1 ? out.p2p_s : 0);
  out.memory = parallel_memory(mi, out.walk);
  // The step ends when the last stage to finish its optimizer step does.
  double end = 0;
  int worst = 0;
  DataParallelTime worst_dp;
  const CollectiveCost tied = tied_embedding_allreduce(in, l);
  out.embedding_allreduce_s = tied.seconds;
  out.embedding_bytes = tied.bytes_sent;
  for (int s = 0; s < p; ++s) {
    DataParallelTime d =
        data_parallel_time(in, l, g, out.memory.stages[static_cast<std::size_t>(s)], st[s]);
    if (s == 0 || s == p - 1) {
      d.comm += tied.seconds;
      d.exposed += tied.seconds;
      d.bytes += tied.bytes_sent;
    }
    const double stage_end = out.walk.end_s[static_cast<std::size_t>(s)] + d.exposed + d.optimizer;
    if (stage_end > end) {
      end = stage_end;
      worst = s;
      worst_dp = d;
    }
  }
  const StageTime& w = st[static_cast<std::size_t>(worst)];
  const double mb = l.micro_batches;
  out.step_stage = worst;
  out.compute_per_mb_s = w.compute;
  out.tp_exposed_s = w.tp_exposed * mb;
  out.cp_exposed_s = w.cp_exposed * mb;
  out.bubble_s = std::max(0.0, out.walk.end_s[static_cast<std::size_t>(worst)] -
                                   out.walk.busy_s[static_cast<std::size_t>(worst)]);
  out.dp_comm_s = worst_dp.comm;
  out.dp_exposed_s = worst_dp.exposed;
  DataParallelTime d0 = data_parallel_time(in, l, g, out.memory.stages[0], st[0]);
  d0.bytes += tied.bytes_sent;
  const auto first_stage = static_cast<double>(stage_blocks(l, m.layers, 0));
  out.tp_bytes = tp_bytes_per_block(m, j, l, e) * first_stage * mb;
  out.cp_bytes = cp_bytes_per_block(m, j, l, e) * first_stage * mb;
  out.pp_bytes =
      p > 1 ? p2p_bytes(m, j, l, e) * mb : 0;  // stage 0 sends activations, receives gradients
  out.dp_bytes = d0.bytes;
  auto& r = out.step;
  r.step_s = end;
  r.optimizer_s = worst_dp.optimizer;
  r.compute_s = w.compute * mb + worst_dp.optimizer;
  for (int k = 0; k < kComputeKinds; ++k) r.compute_by_kind_s[k] = w.kinds[k] * mb;
  r.compute_by_kind_s[static_cast<int>(ComputeKind::optimizer)] += worst_dp.optimizer;
  r.exposed_comm_s = std::max(0.0, r.step_s - r.compute_s - out.bubble_s);
}

void summarize(const StepInput& in, const ParallelLayout& l, ParallelStep& out) {
  const auto& m = *in.model;
  const auto& j = in.job;
  const auto& hw = *in.hardware;
  auto& r = out.step;
  const StageMemory& peak = out.memory.stages[static_cast<std::size_t>(out.memory.peak_stage)];
  r.peak_bytes = out.memory.peak_bytes;
  r.allocated_peak_bytes = peak.total() - peak.overhead_bytes;
  r.reserve_bytes = hw.fragmentation * r.allocated_peak_bytes;
  r.device_bytes = hw.cuda_context_bytes + hw.nccl_workspace_bytes +
                   async_tp_bytes({&m, &hw, in.cluster, j, in.spec, l});
  r.at_peak = {peak.param_bytes,      peak.grad_bytes,   peak.optimizer_bytes,
               peak.activation_bytes, peak.buffer_bytes, peak.overhead_bytes};
  r.model_states = {peak.param_bytes, peak.grad_bytes, peak.optimizer_bytes, 0, 0, 0};
  r.peak_when = out.memory.peak_name;
  r.grad_accumulation = l.micro_batches;
  r.comm_bytes_per_gpu = out.tp_bytes + out.cp_bytes + out.pp_bytes + out.dp_bytes;
  const double tokens = static_cast<double>(j.global_batch) * static_cast<double>(j.seq_len);
  r.tokens_per_s = tokens / r.step_s;
  const double per_token =
      static_cast<double>(m.layers) * block_forward_flops_per_token(m, j.seq_len) +
      head_forward_flops_per_token(m);
  r.model_flops = 3 * per_token * tokens;
  r.mfu = r.model_flops / (r.step_s * in.cluster.gpus * hw.peak(compute_dtype(j.precision)));
}

}  // namespace

namespace {

// The layouts the step simulator walks (one walk: simulator.hpp): one pipeline stage, with any
// tensor and context parallelism (PyTorch's TP plans or Megatron-core's, whichever the recipe's
// code runs; the executor's own TP and ring); with t > 1, without offload. (Pipelines are the
// analytic model's below until the walk takes them.)
bool walked(const StepInput& in, const ParallelLayout& l) {
  if (l.pipeline_parallel != 1 || in.job.micro_batch <= 0 ||
      !layout_problems(l, *in.model, in.job, in.cluster).empty())
    return false;
  return l.tensor_parallel == 1 || in.spec.offload == Offload::none;
}

// The job as one rank of the layout runs it: its share of the ring and of the TP group.
StepInput rank_input(const StepInput& in, const ParallelLayout& l) {
  StepInput rank = in;
  rank.context_parallel = l.context_parallel;
  rank.tensor_parallel = l.tensor_parallel;
  rank.sequence_parallel = l.sequence_parallel;
  rank.async_tensor_parallel = l.async_tensor_parallel;
  rank.cp_rotate = l.cp_rotate;
  return rank;
}

// A walked stage's memory at its peak.
StageMemory stage_memory(const StepResult& r, int stage, double blocks, double in_flight) {
  StageMemory st;
  st.stage = stage;
  st.blocks = blocks;
  st.in_flight = in_flight;
  st.param_bytes = r.at_peak[static_cast<int>(Category::parameters)];
  st.grad_bytes = r.at_peak[static_cast<int>(Category::gradients)];
  st.optimizer_bytes = r.at_peak[static_cast<int>(Category::optimizer_states)];
  st.activation_bytes = r.at_peak[static_cast<int>(Category::activations)];
  st.buffer_bytes = r.at_peak[static_cast<int>(Category::buffers)];
  st.overhead_bytes = r.at_peak[static_cast<int>(Category::overhead)];
  st.moment = r.peak_when;
  return st;
}

// The exposed time and the bytes of a walked stage's rank, by dimension.
void stage_comm(const StepResult& r, ParallelStep& out) {
  out.cp_exposed_s = r.exposed_s[static_cast<int>(Stream::context)];
  out.tp_exposed_s = r.exposed_s[static_cast<int>(Stream::tensor)];
  out.dp_exposed_s = std::max(0.0, r.exposed_comm_s - out.cp_exposed_s - out.tp_exposed_s);
  out.dp_comm_s = 0;  // the data-parallel collectives' streams (not the ring's, not the host's)
  for (const Stream s : {Stream::all_gather, Stream::reduce_scatter, Stream::all_reduce})
    out.dp_comm_s += r.busy_s[static_cast<int>(s)];
  out.cp_bytes = r.context_bytes_per_gpu;
  out.tp_bytes = r.tensor_bytes_per_gpu;
  out.dp_bytes = r.comm_bytes_per_gpu - r.context_bytes_per_gpu - r.tensor_bytes_per_gpu;
}

// One stage walked by the step simulator (one rank of the ring and of the TP group), its report as
// the one stage of the layout.
ParallelStep walk_one_stage(const StepInput& in, const ParallelLayout& l) {
  ParallelStep out;
  auto& r = out.step = simulate_step(rank_input(in, l));
  if (!r.valid) return out;
  StageMemory st = stage_memory(r, 0, static_cast<double>(in.model->layers), 1);
  st.moment.clear();  // the summary names it
  out.memory.stages = {st};
  out.memory.peak_bytes = r.peak_bytes;
  out.memory.peak_name = r.peak_when;
  out.stage_forward_s = {r.forward_per_mb_s};
  out.stage_backward_s = {r.backward_per_mb_s};
  out.compute_per_mb_s = r.forward_per_mb_s + r.backward_per_mb_s;
  stage_comm(r, out);
  return out;
}

// Every stage walked (pipeline_walk.hpp); the step is the stage that ends last.
ParallelStep walk_stages(const StepInput& in, const ParallelLayout& l) {
  ParallelStep out;
  const PipelineStages w = walk_pipeline(rank_input(in, l), l);
  auto& r = out.step;
  if (!w.valid) {
    r = w.stages.empty() ? StepResult{} : w.stages.back();
    r.valid = false;
    r.reason = w.reason;
    r.reason_input = w.reason_input;
    return out;
  }
  const int p = l.pipeline_parallel;
  out.walk = w.walk;
  out.p2p_s = w.p2p_s;
  out.embedding_allreduce_s = w.embedding_allreduce_s;
  out.embedding_bytes = w.embedding_bytes;
  double model_flops = 0;
  for (int s = 0; s < p; ++s) {
    const StepResult& sr = w.stages[static_cast<std::size_t>(s)];
    StageMemory st = stage_memory(sr, s, static_cast<double>(stage_blocks(l, in.model->layers, s)),
                                  w.walk.peak_in_flight[static_cast<std::size_t>(s)]);
    if (sr.peak_bytes > out.memory.peak_bytes) {
      out.memory.peak_bytes = sr.peak_bytes;
      out.memory.peak_stage = s;
      out.memory.peak_name = fmt::format(
          "stage {} of {} ({}{:g} blocks{}, {:g} micro-batches in flight), peak at the {}", s, p,
          s == 0 ? "embeddings, " : "", st.blocks, s == p - 1 ? ", head and loss" : "",
          st.in_flight, sr.peak_when);
      r = sr;
    }
    if (s == 0 || sr.step_s > w.stages[static_cast<std::size_t>(out.step_stage)].step_s)
      out.step_stage = s;
    out.memory.stages.push_back(st);
    out.stage_forward_s.push_back(sr.forward_per_mb_s);
    out.stage_backward_s.push_back(sr.backward_per_mb_s);
    model_flops += sr.model_flops;
  }
  // The step's time is the stage that ends last's; its memory the peak stage's.
  const StepResult& last = w.stages[static_cast<std::size_t>(out.step_stage)];
  const StepResult peak = r;
  r = last;
  r.peak_bytes = peak.peak_bytes;
  r.allocated_peak_bytes = peak.allocated_peak_bytes;
  r.reserve_bytes = peak.reserve_bytes;
  r.at_peak = peak.at_peak;
  r.model_states = peak.model_states;
  r.head_activations_at_peak = peak.head_activations_at_peak;
  r.peak_when = out.memory.peak_name;
  r.model_flops = model_flops;
  r.mfu = model_flops / (r.step_s * in.cluster.gpus *
                         in.hardware->peak(documents::compute_dtype(in.job.precision)));
  out.compute_per_mb_s = last.forward_per_mb_s + last.backward_per_mb_s;
  out.bubble_s = last.bubble_s;
  stage_comm(last, out);
  out.pp_bytes = w.p2p_bytes * l.micro_batches;  // stage 0's activations sent
  r.comm_bytes_per_gpu += out.pp_bytes;
  return out;
}

}  // namespace

double parallel_step_bound(const StepInput& in, const ParallelLayout& l) {
  if (!pipeline_walked(in, l) || in.job.micro_batch <= 0 ||
      !layout_problems(l, *in.model, in.job, in.cluster).empty())
    return 0;
  return pipeline_step_bound(rank_input(in, l), l);
}

ParallelStep simulate_parallel_step(const StepInput& in, const ParallelLayout& l) {
  ParallelStep out;
  if (l.trivial()) {
    out.step = simulate_step(in);
    return out;
  }
  if (walked(in, l)) return walk_one_stage(in, l);
  if (pipeline_walked(in, l) && layout_problems(l, *in.model, in.job, in.cluster).empty() &&
      in.job.micro_batch > 0)
    return walk_stages(in, l);
  auto& r = out.step;
  r.params = in.model->total_params();
  r.micro_batch = in.job.micro_batch;
  r.capacity_bytes = in.hardware->memory_bytes;
  auto problems = layout_problems(l, *in.model, in.job, in.cluster);
  if (const auto why = mpt_unmodeled(*in.model, in.job); !why.empty()) problems.push_back(why);
  if (!problems.empty() || in.job.micro_batch <= 0) {
    r.valid = false;
    r.reason = problems.empty() ? "the micro-batch must be set"
                                : fmt::format("{}", fmt::join(problems, "; "));
    return out;
  }
  if (in.spec.offload != Offload::none) {
    r.valid = false;
    r.reason = "offload is not modeled with tensor, pipeline or context parallelism";
    return out;
  }
  evaluate_stages(in, l, out);
  summarize(in, l, out);
  return out;
}

}  // namespace shardplan::costmodel
