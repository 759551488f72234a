// The step simulator's setup and accounting (simulation.hpp): the plan's check, each unit's
// sizes, times and activations, the model states' placement, the optimizer step and what the
// result reports of them.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "costmodel/block_table.hpp"
#include "costmodel/compute_time.hpp"
#include "costmodel/context_ring.hpp"
#include "costmodel/parallel_memory.hpp"
#include "costmodel/simulation.hpp"
#include "costmodel/traffic.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"
#include "documents/workload.hpp"

namespace shardplan::costmodel::step_walk {

using documents::block_forward_flops_per_token;
using documents::Category;
using documents::Collective;
using documents::dtype_bytes;
using documents::Flavour;
using documents::flavour_name;
using documents::head_forward_flops_per_token;
using documents::kCollectives;
using documents::Offload;
using documents::Optimizer;
using documents::Precision;
using documents::state_bytes;
using documents::UnitKind;
using documents::UnitTensors;

bool Simulation::check_plan() {
  const auto& c = in_.cluster;
  const auto& s = spec_;
  const auto& j = in_.job;
  // llm-foundry's MPT: its block as the llm-foundry recipe runs it, in the variants measured.
  if (const auto why = mpt_unmodeled(*in_.model, j); !why.empty()) {
    fail(why, "--model");
    return false;
  }
  // The data-parallel ranks: each tensor-parallel group is one replica.
  if (c.gpus % tensor_ != 0) {
    fail(fmt::format("{} GPUs are not a multiple of tensor parallel {}", c.gpus, tensor_),
         "--tensor-parallel");
    return false;
  }
  const int model_ranks = tensor_ * stage_.stages;  // one replica: its TP group's stages
  if (c.gpus % model_ranks != 0) {
    fail(fmt::format("{} GPUs are not a multiple of tensor parallel {} x pipeline parallel {}",
                     c.gpus, tensor_, stage_.stages),
         "--pipeline-parallel");
    return false;
  }
  world_ = c.gpus / model_ranks;
  // A tied table under a TP plan is one parameter the embedding and the head would place
  // differently (transformers' unplanned embedding and colwise_rep head; torchtitan's row-wise
  // embedding, whose gradient comes back whole, and colwise output).
  if (tensor_ > 1 && in_.model->tied_embeddings && torch_styles()) {
    fail("tied embeddings under PyTorch's tensor parallelism are not modeled", "--tensor-parallel");
    return false;
  }
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
  if (s.offload != Offload::none && s.main_grad_buffer) {
    fail("Megatron-core's optimizer offload (--optimizer-cpu-offload) is not modeled", "--offload");
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
  if (frameworks_ && s.flavour == Flavour::deepspeed && s.shard_optimizer && sb_.master == 0 &&
      j.precision == Precision::fp32) {
    // DeepSpeed's ZeRO clones each rank's share into an fp32 master partition in fp32 jobs too
    // (single_partition_of_fp32_groups, fp32_partitioned_groups_flat) and steps on an fp32 copy
    // of the gradient partition; stage 0 steps the parameters themselves.
    sb_.master = 4;
    sb_.step_grad = 4;
  }
  compute_b_ = sb_.compute;
  act_b_ = std::min(compute_b_, dtype_bytes(documents::compute_dtype(j.precision)));
  // Gradients are reduced in the spec's dtype, but never below the dtype they are computed in
  // (an fp32 job's FSDP/DeepSpeed defaults of bf16 reduction do not apply: its param dtype is
  // fp32).
  reduce_b_ = paper ? 2.0 : std::max(dtype_bytes(s.reduce_dtype), sb_.compute);
  n_units_ = static_cast<int>(in_.model->layers) + 2;
  if (stage_.chunks.empty()) stage_.chunks = {Chunk{0, n_units_ - 1}};
  counts_ = {};
  for (const Chunk& c : stage_.chunks)
    for (int u = c.first; u <= c.last; ++u) counts_[u == 0 ? 0 : u == n_units_ - 1 ? 2 : 1] += 1;
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
    u.grads = u.plain = u.params;
    // The frameworks keep each small tensor whole; the executor a unit whose tensors are all
    // small (executor/shard_layout.hpp).
    const std::int64_t persistent =
        frameworks_ ? persistent_elements(t, threshold) : persistent_unit_elements(t, threshold);
    u.shardable = s.shard_parameters ? u.params - static_cast<double>(persistent) : u.params;
    u.gather = s.shard_parameters ? u.shardable : 0;
    u.matmul = static_cast<double>(t.matmul_params());
    u.opt_elems = static_cast<double>(optimizer_state_elements(t, j.optimizer));
  }
  // A block's MLP down projection (the last linear of the MLP: Llama's down_proj, GPT-2's c_proj,
  // GPT-NeoX's dense_4h_to_h, MPT's ffn.down_proj), whose gradient the block's backward makes first
  // (accounting.hpp, ActivationBytes::mlp_backward). Its MLP and the norm before it, whose backward
  // ends before the attention's (ActivationBytes::mlp_released).
  // The largest tensor of the embeddings and the head on the rank: matrices split by t, but for
  // torch's row-wise table, whose gradient is whole (torch_tp_elements); a block's, below.
  for (const int k : {0, 2})
    for (const auto& t : tensors[k]->tensors) {
      const bool whole = !t.is_matrix() || (k == 0 && torch_styles());
      units_[k].largest_rest = std::max(units_[k].largest_rest,
                                        static_cast<double>(t.elements()) / (whole ? 1 : tensor_));
    }
  for (const auto& t : m.block.tensors) {
    // Tensor parallelism splits the block's matrices (torch_tp_elements).
    const auto elements = static_cast<double>(t.elements()) / (t.is_matrix() ? tensor_ : 1);
    // (A mixture of experts' fused experts: autocast does not cast their weights,
    // UnitTensors::matmul_params; their down projection's gradient is made first.)
    const bool cast = t.is_matrix() && t.experts == 1;
    if (t.name.rfind("mlp.down_proj.", 0) == 0 || t.name.rfind("mlp.c_proj.", 0) == 0 ||
        t.name.rfind("mlp.dense_4h_to_h.", 0) == 0 || t.name.rfind("ffn.down_proj.", 0) == 0 ||
        t.name == "mlp.experts.down_proj") {
      units_[1].first_grads += elements;
      if (cast) units_[1].first_matmul += elements;
    }
    if (t.name.rfind("mlp.", 0) == 0 || t.name.rfind("post_attention_layernorm.", 0) == 0 ||
        t.name.rfind("ln_2.", 0) == 0 || t.name.rfind("ffn.", 0) == 0 ||
        t.name.rfind("norm_2.", 0) == 0) {
      units_[1].mlp_grads += elements;
      if (cast) units_[1].mlp_matmul += elements;
      units_[1].largest_mlp = std::max(units_[1].largest_mlp, elements);
    } else {
      units_[1].largest_rest = std::max(units_[1].largest_rest, elements);
    }
  }
  if (tensor_ > 1) split_unit_sizes();
  // The head re-gathers the shared embedding matrix, unless that stays whole (persistent).
  const double tied = tied_matrix();
  const bool tied_sharded =
      frameworks_ ? tied >= static_cast<double>(threshold) : units_[0].shardable > 0;
  if (s.shard_parameters && tied > 0 && tied_sharded) units_[2].gather += tied;
  units_[2].matmul += tied;
  // A pipeline's last stage without the embeddings keeps a copy of a tied table of its own, with
  // its gradient and optimizer states, summed with the first stage's (Megatron-core's shared word
  // embeddings; the executor's copy of the whole embedding unit, executor/pipeline.cpp).
  if (tied > 0 && unit_count(0) == 0 && unit_count(2) > 0) {
    const double copy = frameworks_ ? tied : units_[0].params;
    units_[2].params += copy;
    units_[2].grads += copy;
    units_[2].shardable += copy;
    units_[2].opt_elems += units_[0].opt_elems * copy / units_[0].params;
  }
  if (flattens_to_reduce()) flatten_run_bytes_ = largest_flatten_run();
  units_[0].matmul = 0;                     // an embedding lookup is a gather, not a GEMM
  if (s.root_unit && s.shard_parameters) {  // the root gathers the head's parameters with its own
    units_[0].gather += units_[2].gather - tied;
    units_[2].gather = 0;
  }
}

// DeepSpeed's stage-0 all-reduce (engine.py, allreduce_no_retain): the stage's gradients in
// parameter order, taken into a run until it holds more than reduce_bucket_bytes; the largest
// run's bytes.
double Simulation::largest_flatten_run() const {
  const auto& m = *in_.model;
  const UnitTensors* tensors[3] = {&m.embedding, &m.block, &m.head};
  double run = 0, largest = 0;
  for (const Chunk& c : stage_.chunks)
    for (int u = c.first; u <= c.last; ++u) {
      const int k = u == 0 ? 0 : u == n_units_ - 1 ? 2 : 1;
      for (const auto& t : tensors[k]->tensors) {
        run += static_cast<double>(t.elements()) / (t.is_matrix() ? tensor_ : 1) * reduce_b_;
        if (run > spec_.reduce_bucket_bytes) {
          largest = std::max(largest, run);
          run = 0;
        }
      }
    }
  return std::max(largest, run);
}

void Simulation::split_unit_sizes() {
  const auto& m = *in_.model;
  const documents::ParallelLayout l = tensor_layout();
  const auto style = documents::recipe_traits(in_.job.recipe).tp_embedding;
  const UnitTensors* tensors[3] = {&m.embedding, &m.block, &m.head};
  for (int k = 0; k < 3; ++k) {
    auto& u = units_[k];
    if (torch_styles()) {
      const UnitElements e = torch_tp_elements(*tensors[k], in_.job.optimizer, l, style, k == 0);
      u.params = e.params;
      u.grads = e.grads;
      u.plain = e.plain;
      u.opt_elems = e.optimizer;
    } else {
      // Megatron-core's split (tp_local_elements): plain tensors, one foreach group.
      const double whole = u.params;
      u.params = u.grads = u.plain = tp_local_elements(*tensors[k], tensor_, k == 0);
      u.opt_elems *= u.params / std::max(1.0, whole);
    }
    // The sharding engines shard each rank's local tensors as they would the whole ones.
    u.shardable = u.params;
    u.gather = spec_.shard_parameters ? u.params : 0;
    u.matmul = 0;
    for (const auto& t : tensors[k]->tensors)
      if (t.is_matrix()) u.matmul += static_cast<double>(t.elements()) / tensor_;
  }
}

documents::ParallelLayout Simulation::tensor_layout() const {
  documents::ParallelLayout l;
  l.tensor_parallel = tensor_;
  l.sequence_parallel = sequence_parallel_;
  l.async_tensor_parallel = async_tp_;
  return l;
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
  const Forward f{
      act_b_, autocast_copies() || executor_casts() ? std::max(sb_.param, compute_b_) : compute_b_,
      !hw.is_cpu};
  const ComputeModel cm(hw, j);
  // The rank's share of the GEMMs under tensor parallelism: Megatron-core's vocabulary-parallel
  // cross-entropy and torchtitan's loss_parallel keep the loss on the rank's vocabulary columns;
  // transformers' colwise_rep head gathers the logits.
  const TensorSplit split{tensor_, sequence_parallel_,
                          !torch_styles() || documents::recipe_traits(j.recipe).tp_loss ==
                                                 documents::TpLoss::loss_parallel};
  const UnitKind unit_kinds[3] = {UnitKind::embedding, UnitKind::block, UnitKind::head};
  const std::string hooks = framework_key(s);
  for (int k = 0; k < 3; ++k) {
    auto& u = units_[k];
    const UnitWork w = unit_work(cm, m, j, unit_kinds[k], f, k == 1 ? context_ : 1, split);
    HostWork h;
    if (frameworks_) h = unit_host_work(hw, hooks, w, *tensors[k]);
    u.kinds = {};
    u.fwd_kinds = {};
    u.fwd_s = unit_seconds(hw, w.forward, h.forward_s, u.fwd_kinds);
    u.bwd_s = unit_seconds(hw, w.backward, h.backward_s, u.kinds);
    for (int c = 0; c < kComputeKinds; ++c) u.kinds[c] += u.fwd_kinds[c];
  }
  // Recompute: a checkpointed block reruns its forward; Megatron's selective recompute reruns the
  // eager attention core; torchtitan's op-level policy reruns what its save list drops.
  units_[3] = units_[1];
  units_[3].recompute_s = units_[1].fwd_s;
  {
    // The rerun skips what the checkpoint's early stop leaves out (traffic.hpp).
    const double skipped = block_traffic(m, j, f).forward - recompute_traffic(m, j, f).forward;
    units_[3].recompute_s -= std::min(
        cm.traffic_s(skipped), units_[1].fwd_kinds[static_cast<int>(ComputeKind::memory_bound)]);
  }
  const ComputeTimes selective = block_recompute(cm, m, j, f, split);
  units_[1].recompute_s = std::accumulate(selective.begin(), selective.end(), 0.0);
  units_[0].act = embedding_activations(m, j, f);
  block_unit_activations(f);
  units_[2].act = head_activations(m, j, f);
  if (tensor_ > 1 && frameworks_) split_head_activations(f);
  if (!frameworks_) executor_unit_activations(f);
  ring_ = ring_attention(m, j, context_, tensor_, in_.cp_rotate);
  // Mesh order dp, cp, tp (torchtitan's and Megatron's, tp innermost): the tensor-parallel ranks
  // are neighbours in a node, the ring's ranks t apart.
  const int G = in_.cluster.gpus_per_node;
  tensor_group_ = {tensor_, std::min(tensor_, G)};
  context_group_ = {context_, std::min(context_, std::max(1, G / tensor_))};
  tp_buffer_bytes_ = act_b_ * tokens * static_cast<double>(m.hidden);
}

// A block on one rank, saved and (checkpointed) rebuilt: the recipe's block table
// (block_table.hpp) split over the tensor-parallel ranks by whose TP the recipe runs. The
// column-parallel q/k/v and gate/up and the row-parallel o and down split everything between them
// over the heads and the intermediate width; the norms run on every token, or under sequence
// parallelism on the rank's T/t of them; the norms' outputs the column-parallel linears keep are
// whole under PyTorch's styles (PrepareModuleInput all-gathers them, the linears keep the gathered
// tensor) and the rank's shard under Megatron-core's (gathered again in backward). t = 1: the
// whole block.
void Simulation::block_unit_activations(const Forward& f) {
  const auto& m = *in_.model;
  const auto& j = in_.job;
  const double t = tensor_;
  const RankSplit split{t, sequence_parallel_ ? t : 1.0, torch_styles()};
  const BlockTable table = block_table(m, j, f);
  for (const bool checkpointed : {false, true})
    units_[checkpointed ? 3 : 1].act = rank_block(table, m, j, f, split, checkpointed);
}

// The head on one rank of a framework's TP. PyTorch's plans: torch_tp_head (parallel_memory.hpp),
// without autocast's cast of the rank's columns, which the walk keeps itself (forward:
// ui.matmul). Megatron-core's vocabulary-parallel loss keeps the recipe's loss terms on the
// rank's V/t columns, its final norm's state and output as the norms' (split along the sequence
// under sequence parallelism).
void Simulation::split_head_activations(const Forward& f) {
  const auto& m = *in_.model;
  const auto& j = in_.job;
  const double t = tensor_, sp = sequence_parallel_ ? t : 1.0;
  auto& head = units_[2].act;
  if (torch_styles()) {
    const ParallelMemoryInput pin{in_.model, in_.hardware, in_.cluster,
                                  in_.job,   spec_,        tensor_layout()};
    head = torch_tp_head(pin);
    head.saved -= (f.p > f.e ? f.e : 0.0) * units_[2].matmul;
    head.projection = torch_tp_projection_backward(pin);
    return;
  }
  documents::ModelSpec columns = m;
  columns.vocab = static_cast<std::int64_t>(static_cast<double>(m.vocab) / t);
  head = head_activations(columns, j, f);
  const NormParts norm = final_norm_parts(m, j, f);
  head.saved += (norm.state + norm.output) / sp - norm.total();
}

// The executor's own units on a rank (executor_tensors with t, sequence parallelism and the
// rank's T = s·b/c tokens: executor/tensor_parallel_block.cpp, tensor_parallel_vocab.cpp,
// context_parallel_block.cpp). Under its ring a block's backward holds, once the MLP's tensors,
// mid and norm2 and an rstd are freed, the incoming gradient [n, h], the projection input's
// [T, q/t], dq, dk, dv [T, (q + 2kv)/t], delta (fp32 per head and token) and the ring's three
// [T, kv/t] buffers: the block's backward transient is the larger of that and its MLP's. (The
// forward's ring, an fp32 output [T, q/t] and up to three [T, kv/t], stays below the MLP's
// backward moment when q, kv ≤ h ≤ I.)
void Simulation::executor_unit_activations(const Forward& f) {
  const auto& m = *in_.model;
  const double t = tensor_, sp = sequence_parallel_ ? t : 1.0;
  const double T = static_cast<double>(in_.job.seq_len) * static_cast<double>(in_.job.micro_batch);
  const double n = T / sp, h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  const double I = static_cast<double>(m.intermediate), a = static_cast<double>(m.heads);
  const ExecutorTensors x = executor_tensors(m, f.e, T, t, sequence_parallel_);
  double transient = x.block_transient;
  if (context_ > 1) {
    const double mlp_width = m.mlp == documents::MlpKind::gelu ? 2.0 : 3.0;
    const double ring =
        f.e * n * h + f.e * T * (2 * q + 5 * kv) / t + 4 * a * T / t -
        (mlp_width * f.e * T * I / t + f.e * n * h * (m.parallel_residual ? 1 : 2) + x.norm_stats);
    transient = std::max(transient, ring);
  }
  units_[1].act.backward = transient;
  units_[3].act.backward = transient;
  units_[2].act = {};
  units_[2].act.saved = x.head;
  units_[2].act.backward = x.head_transient;
}

// The shard and replica groups, the forward prefetch, each unit kind's all-gather, and the
// cleared timeline.
void Simulation::prepare_gathers() {
  const auto& s = spec_;
  const auto& hw = *in_.hardware;
  // The data-parallel ranks on a node: one per tensor-parallel group.
  const int G = std::max(1, in_.cluster.gpus_per_node / tensor_);
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
  reduced_.assign(n, 0);
  events_.clear();
  events_.reserve(n * 12);
  for (auto& e : cost_cache_) e.size = -1;
}

std::optional<Simulation::States> Simulation::place_states() {
  const auto& hw = *in_.hardware;
  const auto& s = spec_;
  const double S = shard_;
  States st;
  for (int k = 0; k < 3; ++k) {
    const double count = unit_count(k);
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
  if (s.grad_bucket_copy && in_.accounting == Accounting::framework && ddp_wrapped())
    mem(0, st.total_params * sb_.grad, Category::buffers, Phase::setup, -1, 0);
  // Megatron-core's main-gradient buffer, allocated with the model (its DDP wrapper).
  if (main_grad_buffer())
    mem(0, st.total_params * sb_.grad, Category::gradients, Phase::setup, -1, 0);
  if (persistent_flat_partition())
    mem(0, st.total_params / shard_ * flat_grad_b_, Category::gradients, Phase::setup, -1, 0);
  if (s.contiguous_grad_bucket && in_.accounting == Accounting::framework && !backward_bucket() &&
      !executor_stages()) {
    // The spec's bucket is in bytes: DeepSpeed's reduce_bucket_size elements of the reduce
    // dtype, sized where the plan is made (planner's with_job_precision, the DeepSpeed import;
    // deepspeed/runtime/zero/stage_1_and_2.py, ipg_buckets). DeepSpeed 0.19.8 keeps one bucket
    // per dtype in every stage (measured: tests/costmodel/data/oracle_deepspeed.json), and so
    // does the executor.
    mem(0, s.reduce_bucket_bytes, Category::buffers, Phase::setup, -1, 0);
  }
  return st;
}

// Bandwidth-bound over the local shard (read gradient, read and write master and moments, write
// parameters), or on the host when offloaded.
double Simulation::optimizer_step(double t, const States& states) {
  t = spec_.offload == Offload::none ? device_optimizer(t, states) : host_optimizer(t, states);
  return gather_updated_parameters(t, states);
}

double Simulation::device_optimizer(double t, const States& states) {
  const auto& j = in_.job;
  const auto& s = spec_;
  const double S = shard_;
  const double local_opt_params = states.local_opt_params;
  double opt_elems_local = 0;
  for (int k = 0; k < 3; ++k)
    opt_elems_local += unit_count(k) * units_[k].opt_elems / (s.shard_optimizer ? S : 1.0);
  // DeepSpeed stages 1/2 flatten the partition's gradients into a new tensor of their dtype and
  // cast that to fp32 (stage_1_and_2.py, step: flatten(averaged_gradients).to(fp32)), so in a
  // mixed-precision job both copies are alive at once; stage 3 casts its flat partition as it
  // is.
  // At stage 0, FP16_Optimizer flattens a list of every gradient's fp32 cast into its master's
  // gradient, the list and the flat copy alive at once (deepspeed/runtime/fp16/fused_optimizer.py,
  // step); FP16_UnfusedOptimizer casts each gradient into its own master's .grad
  // (unfused_optimizer.py, step).
  // DeepSpeed's wrappers that step an fp32 copy of the gradients (not BF16_Optimizer's buffer),
  // and the one of them that keeps no flattened copy.
  const bool wrapper_copy = frameworks_ && s.separate_fp32_master && !s.flat_grad_partition &&
                            !s.main_grad_buffer && sb_.step_grad > 0;
  const bool unfused_wrapper = !s.shard_optimizer && s.torch_optimizer;
  const double flatten_b = wrapper_copy && !unfused_wrapper && sb_.grad < sb_.step_grad
                               ? (s.shard_optimizer ? sb_.grad : sb_.step_grad)
                               : 0.0;
  const double step_copies = sb_.step_grad + flatten_b;
  const double bytes =
      local_opt_params * (sb_.grad + sb_.step_grad + 2 * flatten_b + 2 * sb_.master + sb_.param) +
      2 * opt_elems_local * sb_.moment;
  const double dur = bytes / memory_Bps();
  const double st = issue(Stream::compute, t, Stream::compute, dur, "optimizer step", -1);
  mem(st, local_opt_params * step_copies, Category::gradients, Phase::optimizer, -1, 1);
  // Before the inner optimizer steps, DeepSpeed's wrappers drop the flattened copy and the
  // low-precision gradients it was cast from (stage_1_and_2.py step: del flat_grad_partition,
  // free_grad_in_param_list, averaged_gradients None; fp16/fused_optimizer.py: p.grad None);
  // FP16_UnfusedOptimizer keeps them to zero_grad.
  const bool drops_grads = wrapper_copy && !unfused_wrapper;
  const double dropped = local_opt_params * flatten_b + (drops_grads ? kept_grad_bytes_ : 0.0);
  mem(st, -dropped, Category::gradients, Phase::optimizer, -1, 1);
  if (drops_grads) kept_grad_bytes_ = 0;
  mem(st + dur, dropped - local_opt_params * step_copies, Category::gradients, Phase::optimizer, -1,
      1);
  // torch.optim.Adam/AdamW with foreach (the default on GPUs; torch/optim/adam.py,
  // _multi_tensor_adam) first writes sqrt(exp_avg_sq) of every local parameter into new
  // tensors: one intermediate of the local shard in the state dtype. DeepSpeed's and Megatron's
  // FusedAdam update in place.
  const bool foreach_adam = frameworks_ && !documents::fused_adam(s) &&
                            (j.optimizer == Optimizer::adam || j.optimizer == Optimizer::adamw);
  if (foreach_adam) {
    // foreach takes no mix of DTensors and plain tensors in one group: under a TP plan the plain
    // ones (hf: the embeddings and norms) are a group of their own, and the larger group's
    // intermediate is the step's.
    double foreach_elems = local_opt_params;
    // torchtitan builds one optimizer per model chunk of a pipeline stage and steps them in turn
    // (torchtitan/components/optimizer.py, OptimizersContainer): the largest chunk's.
    if (stage_.torch_pipelining() && stage_.chunks.size() > 1) {
      foreach_elems = 0;
      for (const Chunk& c : stage_.chunks) {
        double n = 0;
        for (int u = c.first; u <= c.last; ++u) n += info(u).params;
        foreach_elems = std::max(foreach_elems, n / (s.shard_optimizer ? S : 1.0));
      }
    }
    if (tensor_ > 1) {
      double plain = 0;
      for (int k = 0; k < 3; ++k) plain += unit_count(k) * units_[k].plain;
      plain /= s.shard_optimizer ? S : 1.0;
      foreach_elems = std::max(plain, local_opt_params - plain);
    }
    mem(st, foreach_elems * sb_.moment, Category::optimizer_states, Phase::optimizer, -1, 1);
    mem(st + dur, -foreach_elems * sb_.moment, Category::optimizer_states, Phase::optimizer, -1, 1);
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
  const auto& s = spec_;
  const double S = shard_;
  result_.model_states[static_cast<int>(Category::parameters)] = states.param_bytes;
  result_.model_states[static_cast<int>(Category::optimizer_states)] = states.opt_bytes;
  double grads = 0;
  for (int k = 0; k < 3; ++k) {
    const double count = unit_count(k);
    const double g = s.shard_gradients
                         ? units_[k].params / S * (s.flat_grad_partition ? flat_grad_b_ : sb_.grad)
                         : units_[k].grads * sb_.grad;
    grads += count * g;
  }
  if (s.offload != Offload::none && s.shard_gradients) grads = 0;
  result_.model_states[static_cast<int>(Category::gradients)] = grads;
}

// Overheads outside the allocator's view: CUDA context, NCCL workspace, fragmentation reserve.
void Simulation::add_overheads() {
  const auto& hw = *in_.hardware;
  const double frag = hw.fragmentation * result_.allocated_peak_bytes;
  // Async tensor parallelism's communication buffers, outside the caching allocator.
  const double async_tp =
      async_tp_
          ? async_tp_bytes({in_.model, in_.hardware, in_.cluster, in_.job, spec_, tensor_layout()})
          : 0.0;
  const double overhead = hw.cuda_context_bytes + hw.nccl_workspace_bytes + frag + async_tp;
  result_.reserve_bytes = frag;
  result_.device_bytes = hw.cuda_context_bytes + hw.nccl_workspace_bytes + async_tp;
  result_.at_peak[static_cast<int>(Category::overhead)] += overhead;
  result_.peak_bytes = result_.allocated_peak_bytes + overhead;
}

// Time of the step: all micro-batches. compute busy time scales the same way.
void Simulation::account_compute(std::int64_t gas, const FirstMicroBatch* first) {
  double compute_per_mb = 0, recompute_per_mb = 0;
  for (const Chunk& chunk : stage_.chunks)
    for (int u = chunk.first; u <= chunk.last; ++u) {
      const auto& ui = info(u);
      compute_per_mb += ui.fwd_s + ui.bwd_s + ui.recompute_s;
      recompute_per_mb += ui.recompute_s;
      result_.forward_per_mb_s += ui.fwd_s;
      result_.backward_per_mb_s += ui.bwd_s + ui.recompute_s;
      for (int c = 0; c < kComputeKinds; ++c)
        result_.compute_by_kind_s[c] += ui.kinds[c] * static_cast<double>(gas);
    }
  result_.compute_s = compute_per_mb * static_cast<double>(gas) + result_.optimizer_s;
  result_.recompute_s = recompute_per_mb * static_cast<double>(gas);
  result_.compute_by_kind_s[static_cast<int>(ComputeKind::recompute)] = result_.recompute_s;
  result_.compute_by_kind_s[static_cast<int>(ComputeKind::optimizer)] = result_.optimizer_s;
  if (first && gas > 1) {  // the first simulated micro-batch stands for gas − 1 of them
    const double extra = static_cast<double>(gas - 2);
    for (int k = 0; k < kStreams; ++k) {
      result_.busy_s[k] += extra * first->busy[k];
      result_.exposed_s[k] += extra * first->exposed[k];
    }
    result_.comm_bytes_per_gpu += extra * first->bytes;
    for (int k = 0; k < kCollectives; ++k)
      result_.comm_bytes_by_op[k] += extra * first->bytes_by_op[k];
  }
}

}  // namespace shardplan::costmodel::step_walk
