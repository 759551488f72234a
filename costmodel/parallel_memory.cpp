// What one rank holds under tensor parallelism, as the step walk (simulation.hpp) splits each
// unit: Megatron-core's split of a block's activations (layer_activations) and of its elements
// (tp_local_elements), PyTorch's styles as hf's and torchtitan's plans apply them
// (torch_tp_elements, torch_tp_block, torch_tp_head and their backward transients), async TP's
// buffers; and the op order each recipe's pipeline runs (stage_orders).
#include "costmodel/parallel_memory.hpp"
#include "costmodel/block_table.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/pipeline_order.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace shardplan::costmodel {

using documents::AsyncTp;
using documents::AttentionImpl;
using documents::Checkpointing;
using documents::compute_dtype;
using documents::dtype_bytes;
using documents::Flavour;
using documents::LossImpl;
using documents::MlpKind;
using documents::ModelSpec;
using documents::NormKind;
using documents::Offload;
using documents::Optimizer;
using documents::ParallelLayout;
using documents::peak_held;
using documents::pipeline_parts;
using documents::PipelineRunner;
using documents::PipeOp;
using documents::PipeOpKind;
using documents::recipe_traits;
using documents::RecipeTraits;
using documents::schedule_ops;
using documents::stage_blocks;
using documents::stage_first_block;
using documents::state_bytes;
using documents::StateBytes;
using documents::TensorParallelCode;
using documents::TpEmbedding;
using documents::TpLoss;
using documents::TrainingJob;
using documents::UnitTensors;

// Megatron-core's split of its block (block_table.cpp, korthikanti_rows: Korthikanti et al. 2022,
// §4.1 and Table 2): what lies between the column- and row-parallel linears split by t, the rest
// (the norm inputs, the linears' inputs, the masks) whole on every rank, or split along the
// sequence under sequence parallelism. Context parallelism gives each rank T = s·b/c tokens.
LayerActivations layer_activations(const ModelSpec& m, const TrainingJob& j,
                                   const ParallelLayout& l, double e) {
  TrainingJob local = j;
  local.seq_len = j.seq_len / l.context_parallel;
  const BlockTable b = block_table(m, local, Forward{e, e, true});
  const double t = l.tensor_parallel;
  const RankSplit split{t, l.sequence_parallel ? t : 1.0, false};
  LayerActivations out;
  out.outside =
      (placement_bytes(b, Placement::residual) + placement_bytes(b, Placement::linear_input)) /
      split.sp;
  out.inside = placement_bytes(b, Placement::heads) / t;
  out.core = rank_core_bytes(b, split);
  return out;
}

namespace {

// A column-parallel linear's bias, by the Hugging Face module names of the linears Megatron makes
// ColumnParallelLinear (their output features split, and with them the bias:
// megatron/core/tensor_parallel/layers.py, ColumnParallelLinear, bias of
// output_size_per_partition): the query, key and value projections, fused or not, and the MLP's
// up and gate projections.
bool column_parallel_bias(const std::string& name) {
  if (!name.ends_with(".bias")) return false;
  for (const char* module :
       {"q_proj.", "k_proj.", "v_proj.", "c_attn.", "query_key_value.", "qkv_proj.", "W_pack.",
        "gate_proj.", "up_proj.", "gate_up_proj.", "c_fc.", "dense_h_to_4h.", "fc1."})
    if (name.find(module) != std::string::npos) return true;
  return false;
}

}  // namespace

double tp_local_elements(const UnitTensors& u, int t, bool embedding) {
  double n = 0;
  for (std::size_t i = 0; i < u.tensors.size(); ++i) {
    const auto& x = u.tensors[i];
    const bool split = x.is_matrix() ? !(embedding && i > 0)  // of the embeddings, the token table
                                     : column_parallel_bias(x.name);
    n += static_cast<double>(x.elements()) / (split ? t : 1);
  }
  return n;
}

UnitElements torch_tp_elements(const UnitTensors& u, Optimizer o, const ParallelLayout& l,
                               TpEmbedding style, bool embedding) {
  const double t = l.tensor_parallel;
  UnitElements out;
  for (std::size_t i = 0; i < u.tensors.size(); ++i) {
    const auto& x = u.tensors[i];
    const double whole = static_cast<double>(x.elements());
    const bool table = embedding && i == 0;
    const bool split = x.is_matrix() && (!embedding || (table && style == TpEmbedding::rowwise));
    out.params += whole / (split ? t : 1);
    out.grads += table ? whole : whole / (split ? t : 1);
    // t = 1: no DTensor at all, every parameter a plain tensor of one foreach group.
    const bool plain =
        t == 1 ||
        (style == TpEmbedding::unplanned ? !split : !x.is_matrix() && !l.sequence_parallel);
    if (plain) out.plain += whole;
  }
  out.optimizer = static_cast<double>(optimizer_state_elements(u, o)) * out.params /
                  std::max<double>(1, static_cast<double>(u.params()));
  return out;
}

namespace {

// The forward's dtypes (accounting.hpp, Forward): e bytes of the compute dtype; p of the
// parameters the blocks read (fp32 under DDP's autocast and FSDP's fp32_gathered, e when FSDP
// hands them over in the compute dtype).
Forward plan_forward(const ParallelMemoryInput& in) {
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const StateBytes sb = state_bytes(in.job.precision, in.spec, Accounting::framework);
  const bool gathered_16 = in.spec.shard_parameters && !in.spec.fp32_gathered;
  return {e, gathered_16 ? e : std::max(e, sb.param), !in.hardware->is_cpu};
}

}  // namespace

// The block's table (block_table.hpp) split as PyTorch's styles split it (the norms' outputs kept
// gathered), plus autocast's casts of the rank's weights, kept for backward like the activations.
ActivationBytes torch_tp_block(const ParallelMemoryInput& in, bool checkpointed) {
  const auto& m = *in.model;
  const Forward f = plan_forward(in);
  const double t = in.layout.tensor_parallel;
  const RankSplit split{t, in.layout.sequence_parallel ? t : 1.0, true};
  ActivationBytes out = rank_block(block_table(m, in.job, f), m, in.job, f, split, checkpointed);
  if (f.p > f.e) out.saved += f.e * static_cast<double>(m.block.matmul_params()) / t;
  return out;
}

namespace {

// The head on one rank: the final norm (its state split under sequence parallelism, the
// projection's input whole), then the loss.
//   hf          lm_head "colwise_rep" (ColwiseParallel(output_layouts=Replicate())) gathers the
//               logits, and the model's own loss runs on the whole vocabulary: the unsplit
//               head's loss terms (head_activations; the upcast loss's backward holds the two
//               fp32 [T, V] gradients at once).
//   torchtitan  ColwiseParallel(output_layouts=Shard(-1)) under loss_parallel() (torchtitan's
//               parallelize applies it unless disable_loss_parallel): the upcast loss on the
//               rank's V/t columns keeps the fp32 log-probabilities [T, V/t] and the targets; its
//               backward (torch/distributed/tensor/parallel/loss.py,
//               _nll_loss_and_log_softmax_backward: (grad_input + exp(x)) * grad_output, with
//               grad_input = zeros_like(x)) holds three fp32 [T, V/t] tensors at once. Other
//               losses: their unsplit terms over V/t columns.
ActivationBytes plan_head(const ParallelMemoryInput& in, const Forward& f) {
  const auto& j = in.job;
  const double t = in.layout.tensor_parallel;
  const double sp = in.layout.sequence_parallel ? t : 1.0;
  const NormParts norm = final_norm_parts(*in.model, j, f);
  const double T = static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch);
  ActivationBytes out;
  const bool loss_parallel = recipe_traits(j.recipe).tp_loss == TpLoss::loss_parallel;
  if (loss_parallel && j.loss == LossImpl::upcast) {
    const double V = static_cast<double>(in.model->vocab) / t;
    out.saved = 4 * T * V + 8 * T;
    // t = 1 (under a pipeline): no loss_parallel, aten's own ops: nll_loss_backward's gradient
    // (zeros, the targets' entries scattered) and _log_softmax_backward_data's result, two fp32
    // [T, V] at once beside the saved log-probabilities.
    out.backward = (t > 1 ? 3 : 2) * 4 * T * V;
    out.loss = 4 * T * V;
  } else if (loss_parallel) {
    ModelSpec columns = *in.model;
    columns.vocab = static_cast<std::int64_t>(static_cast<double>(columns.vocab) / t);
    out = head_activations(columns, j, f);
    out.saved -= norm.total();
  } else {
    out = head_activations(*in.model, j, f);
    out.saved -= norm.total();
  }
  out.saved += norm.state / sp + norm.output;
  // Autocast's cast of the rank's projection columns.
  if (f.p > f.e) out.saved += f.e * static_cast<double>(in.model->head.matmul_params()) / t;
  return out;
}

}  // namespace

ActivationBytes torch_tp_head(const ParallelMemoryInput& in) {
  return plan_head(in, plan_forward(in));
}

// The projection's backward: the logits' gradient [T, V/t] in the compute dtype and its input's
// gradient [T, h]; the loss's fp32 log-probabilities have been released.
double torch_tp_projection_backward(const ParallelMemoryInput& in) {
  const double e = plan_forward(in).e;
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  return e * T * static_cast<double>(in.model->vocab) / in.layout.tensor_parallel +
         e * T * static_cast<double>(in.model->hidden);
}

// torch.distributed.pipelining's op order for ScheduleInterleaved1F1B on stage (rank) s of p with
// v chunks and m micro-batches (torch/distributed/pipelining/schedules.py,
// ScheduleInterleaved1F1B._calculate_single_rank_operations with _get_warmup_ops and
// _get_1f1b_rank_ops): rounds r = max(1, m / p) of m / r micro-batches each; warm-up
// min((v − 1)·m/r + 2·(p − 1 − s), m·v) forwards, then one forward one backward, then the
// backwards. The k-th forward runs local chunk (k / (m/r)) mod v, the k-th backward (counted from
// the first forward after the warm-up) chunk v − 1 − (k / (m/r)) mod v; each chunk takes its
// micro-batches in order. With m = p this differs from Megatron's order (schedule_ops), which
// runs every forward first when m = p; with m a multiple of p above p they agree.
std::vector<PipeOp> torch_interleaved_ops(int p, int s, int v, int m) {
  const int rounds = std::max(1, m / p);
  const int per_round = m / rounds;
  const int total = m * v;
  const int warmup = std::min((v - 1) * per_round + 2 * (p - 1 - s), total);
  std::vector<int> next_forward(static_cast<std::size_t>(v), 0);
  std::vector<int> next_backward(static_cast<std::size_t>(v), 0);
  std::vector<PipeOp> ops;
  auto forward = [&](int k) {
    const int chunk = (k / per_round) % v;
    ops.push_back({PipeOpKind::forward, next_forward[static_cast<std::size_t>(chunk)]++, chunk});
  };
  auto backward = [&](int k) {
    const int chunk = v - 1 - ((k - warmup) / per_round) % v;
    ops.push_back({PipeOpKind::backward, next_backward[static_cast<std::size_t>(chunk)]++, chunk});
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = warmup; k < total; ++k) {
    forward(k);
    backward(k);
  }
  for (int k = total; k < total + warmup; ++k) backward(k);
  return ops;
}

// Async tensor parallelism's buffers on one rank, T = s·b/c tokens per micro-batch, e bytes of
// the compute dtype; allocated at the first overlapped GEMM and kept (outside torch's caching
// allocator: device memory nvidia-smi sees, max_memory_allocated does not):
//   symmetric_memory  torch 2.15 (torch/distributed/_symmetric_memory/__init__.py):
//                     get_symm_mem_workspace keeps one workspace per group, grown to the largest
//                     request; fused_all_gather_matmul asks for the rank's shard [T/t, h],
//                     fused_matmul_reduce_scatter for two output chunks [T/t, h]
//                     (_pipelined_produce_and_all2all double-buffers them): 2·e·T·h/t
//   userbuffers       Transformer Engine 2.x (transformer_engine/pytorch/module/base.py,
//                     initialize_ub) with Megatron-LM's shape [s·b/c, h]: a communicator per
//                     overlapped GEMM (qkv, proj, fc1, fc2: 4 ring-exchange, 2 pipelined, 4 bulk
//                     and 2 external by default), each with a buffer of that shape in the compute
//                     dtype: 12·e·T·h (the three cuBLAS workspaces it keeps left out)
double async_tp_bytes(const ParallelMemoryInput& in) {
  const auto& l = in.layout;
  if (!l.async_tensor_parallel) return 0;
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const double T = static_cast<double>(in.job.seq_len) / l.context_parallel *
                   static_cast<double>(in.job.micro_batch);
  const double h = static_cast<double>(in.model->hidden);
  switch (recipe_traits(in.job.recipe).async_tp) {
  case AsyncTp::symmetric_memory:
    return 2 * e * T * h / l.tensor_parallel;
  case AsyncTp::userbuffers:
    return 12 * e * T * h;
  case AsyncTp::none:
    break;
  }
  return 0;
}

std::vector<std::vector<PipeOp>> stage_orders(const ParallelMemoryInput& in) {
  const auto& l = in.layout;
  const int p = l.pipeline_parallel;
  if (l.virtual_stages > 1 &&
      recipe_traits(in.job.recipe).pipeline == PipelineRunner::torch_pipelining) {
    std::vector<std::vector<PipeOp>> ops(static_cast<std::size_t>(p));
    for (int s = 0; s < p; ++s)
      ops[static_cast<std::size_t>(s)] =
          torch_interleaved_ops(p, s, l.virtual_stages, l.micro_batches);
    return ops;
  }
  return schedule_ops(l.schedule, p, l.virtual_stages, l.micro_batches);
}

}  // namespace shardplan::costmodel
