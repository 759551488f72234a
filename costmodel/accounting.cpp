#include "costmodel/accounting.hpp"
#include "costmodel/block_table.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"

#include <algorithm>

#include <cmath>
#include <fmt/format.h>
#include <string_view>

namespace shardplan::costmodel {

using documents::Activation;
using documents::Architecture;
using documents::AttentionImpl;
using documents::Checkpointing;
using documents::LossImpl;
using documents::MlpKind;
using documents::ModelSpec;
using documents::NormKind;
using documents::Optimizer;
using documents::PositionKind;
using documents::Precision;
using documents::recipe_traits;
using documents::RmsNormCode;
using documents::SavedTensors;
using documents::ShardingSpec;
using documents::state_bytes;
using documents::StateBytes;
using documents::TrainingJob;
using documents::UnitTensors;

StateBytes state_bytes(Precision p, const ShardingSpec& spec, Accounting a) {
  StateBytes b;
  if (a == Accounting::zero_paper) {
    // ZeRO §3: fp16 parameters 2, fp16 gradients 2, K = 12 (fp32 master + two fp32 moments).
    b.param = 2;
    b.grad = 2;
    b.master = 4;
    b.moment = 4;
    b.compute = 2;
    return b;
  }
  return documents::state_bytes(p, spec);
}

std::int64_t optimizer_state_elements(const UnitTensors& u, Optimizer o) {
  switch (o) {
  case Optimizer::adam:
  case Optimizer::adamw:
    return 2 * u.params();
  case Optimizer::sgd:
    return u.params();
  case Optimizer::adafactor: {
    std::int64_t n = 0;
    for (const auto& t : u.tensors) n += t.is_matrix() ? t.rows + t.cols : t.elements();
    return n;
  }
  }
  return 0;
}

std::int64_t persistent_elements(const UnitTensors& u, std::int64_t threshold) {
  std::int64_t n = 0;
  for (const auto& t : u.tensors)
    if (t.elements() < threshold) n += t.elements();
  return n;
}

std::int64_t persistent_unit_elements(const UnitTensors& u, std::int64_t threshold) {
  for (const auto& t : u.tensors)
    if (t.elements() >= threshold) return 0;
  return u.params();
}

double selective_op_recompute_flops_per_token(const ModelSpec& m) {
  // Of a Llama block's five matmuls (wqkv, wo, w1, w3, w2) the 2nd and 4th are recomputed.
  return 2.0 * (static_cast<double>(m.q_width() * m.hidden) +
                static_cast<double>(m.hidden * m.intermediate));
}

std::string mpt_unmodeled(const ModelSpec& m, const TrainingJob& j) {
  if (m.architecture != Architecture::mpt) return "";
  if (!recipe_traits(j.recipe).runs_mpt)
    return fmt::format("MPT's model code is llm-foundry's: plan it with --recipe llm-foundry, not "
                       "{}",
                       documents::recipe_name(j.recipe));
  // What these keep is not measured (tests/costmodel/data/oracle_mpt_units.json has none of them).
  if (!m.unmeasured.empty()) return fmt::format("MPT's {} is not modeled yet", m.unmeasured);
  return "";
}

ActivationBytes block_activations(const ModelSpec& m, const TrainingJob& j, const Forward& f,
                                  bool checkpointed) {
  ActivationBytes out = rank_block(block_table(m, j, f), m, j, f, RankSplit{}, checkpointed);
  // The executor's backward, in its MLP part (executor_tensors).
  if (!recipe_traits(j.recipe).framework)
    out.backward = executor_tensors(m, f.e, Shape(m, j).T, 1, false).block_transient;
  return out;
}

double rotary_table_bytes(const ModelSpec& m, const TrainingJob& j, double p) {
  // torchtitan keeps freqs_cis as a module buffer; Megatron's formula and the executor count
  // no table.
  // (MPT's rope_impl hf makes its tables in every block: block_table.cpp, mpt_qkv.)
  if (m.positions != PositionKind::rotary || !recipe_traits(j.recipe).transformers_code ||
      m.architecture == Architecture::mpt)
    return 0;
  // transformers' rotary embedding: cos and sin per position over the rotary width (GPT-NeoX:
  // rotary_pct of the head), in the residual dtype, computed once and read by every block.
  return 2 * p * static_cast<double>(j.seq_len) * static_cast<double>(m.rotary_dim);
}

double checkpointed_mask_bytes(const ModelSpec& m, const TrainingJob& j, double p) {
  // A mask the model builds once and hands to each block as an argument, which
  // torch.utils.checkpoint keeps for the recompute: GPT2Model's eager path, a [b, 1, s, s]
  // additive mask; transformers' sliding-window mask for sdpa (sdpa_gets_mask), a boolean
  // [1, 1, s, s] expanded over the batch (masking_utils.sdpa_mask: the mask function of the
  // positions alone, then expand), one byte per query and key of one sequence.
  bool any = false;
  for (std::int64_t b = 0; b < m.layers && !any; ++b) any = j.block_checkpointed(b);
  if (!any || !recipe_traits(j.recipe).transformers_code) return 0;
  const auto s = static_cast<double>(j.seq_len);
  if (m.architecture == Architecture::gpt2 && j.attention == AttentionImpl::eager)
    return p * static_cast<double>(j.micro_batch) * s * s;
  return sdpa_gets_mask(m, j) ? s * s : 0;
}

ActivationBytes embedding_activations(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const double p = f.p;
  ActivationBytes out;
  const Shape x(m, j);
  // The executor's int32 tokens and targets, kept for the step (executor/synthetic_data.hpp).
  if (!recipe_traits(j.recipe).framework) out.saved = 8 * x.T;
  if (recipe_traits(j.recipe).saved == SavedTensors::korthikanti) return out;
  // nn.Embedding's backward needs the int64 token ids (GPT-2 also its int64 position ids);
  // embedding dropout keeps a mask (1-byte on CUDA, the embeddings' dtype on a CPU).
  out.saved = 8 * x.T + rotary_table_bytes(m, j, p) + checkpointed_mask_bytes(m, j, p);
  if (m.positions == PositionKind::learned) out.saved += 8 * x.s;
  if (m.embedding_dropout) out.saved += (f.cuda ? 1.0 : p) * x.T * x.h;
  return out;
}

namespace {

// What the loss keeps of the logits and what its forward and backward hold at once.
void add_loss_activations(ActivationBytes& out, const Shape& x, const TrainingJob& j,
                          const Forward& f) {
  const double e = f.e;
  const double T = x.T, h = x.h, V = x.V;
  const double labels = j.loss == LossImpl::chunked || j.loss == LossImpl::fused_linear ? 0 : 8 * T;
  switch (j.loss) {
  case LossImpl::upcast:
    // ForCausalLMLoss / torchtitan's cross_entropy_loss: logits.float(), then cross_entropy =
    // nll_loss(log_softmax(.)), which keeps its fp32 output. The logits (and their fp32 copy)
    // live through the forward only: HF Trainer's compute_loss keeps just the loss, torchtitan
    // deletes pred before backward. In backward the gradients of the log-probabilities and of
    // the logits are both fp32 at once.
    out.saved += 4 * T * V + labels;
    out.forward = e * T * V + (e < 4 ? 4 * T * V : 0);
    out.backward = 8 * T * V;
    out.loss = 4 * T * V + labels;
    break;
  case LossImpl::fused:
    // flash-attn's CrossEntropyLoss (and a compiled loss): the logits and an fp32 log-sum-exp
    // per token; the backward writes one gradient of the logits' size.
    out.saved += e * T * V + 4 * T + labels;
    out.backward = e * T * V;
    out.loss = e * T * V + 4 * T + labels;
    break;
  case LossImpl::fp32_inplace:
    // megatron/core/tensor_parallel/cross_entropy.py: the logits cast to fp32, exponentiated
    // and normalized in place and kept as the softmax; the 16-bit logits die with the forward;
    // the backward turns the softmax into the gradient in place, then casts it to 16 bits.
    out.saved += 4 * T * V + labels;
    out.forward = e < 4 ? e * T * V : 0;
    out.backward = e < 4 ? e * T * V : 0;
    out.loss = 4 * T * V + labels;
    break;
  case LossImpl::chunked:
  case LossImpl::fused_linear: {
    // The loss and its gradients are computed inside the forward, C tokens at a time, and only
    // the gradient of the hidden states stays (with the final norm's output it was computed
    // from). torchtitan's ChunkedLossWrapper (torchtitan/components/loss.py) splits the
    // sequence into N chunks and runs lm_head, the upcast cross-entropy and its backward per
    // chunk: at the worst moment a chunk holds its logits, the fp32 log-probabilities and the
    // two fp32 gradients of the upcast path. Liger's fused linear cross-entropy
    // (liger_kernel/ops/fused_linear_cross_entropy.py) picks C = the next power of two of
    // T / ceil(V / h), keeps the weight's gradient (in the dtype of the weight it reads) and
    // rewrites the chunk's logits into their gradient in place.
    double C = 0;
    double per_token = 0;
    if (j.loss == LossImpl::chunked) {
      const double n = static_cast<double>(j.loss_chunks);
      C = x.T / x.s * std::ceil(x.s / n);
      per_token = e + 12;
      out.saved += e * T * h;
    } else {
      const double inc = std::ceil(V / h);
      C = std::min(T, std::exp2(std::ceil(std::log2(std::ceil(T / inc)))));
      per_token = e;
      out.saved += e * T * h + f.p * V * h;
    }
    out.forward = per_token * C * V;
    break;
  }
  }
}

}  // namespace

ExecutorTensors executor_tensors(const ModelSpec& m, double e, double T, double t,
                                 bool sequence_parallel) {
  const double n = T / (sequence_parallel ? t : 1.0);
  const double h = static_cast<double>(m.hidden);
  const double I = static_cast<double>(m.intermediate), V = static_cast<double>(m.vocab);
  const double mlp_width = m.mlp == MlpKind::gelu ? 2.0 : 3.0;
  ExecutorTensors out;
  out.norm_stats = (m.norm == NormKind::layernorm ? 2.0 : 1.0) * 4 * n;
  out.block_transient =
      e * n * h + e * T * h * (sequence_parallel ? 2.0 : 1.0) + (mlp_width - 1) * e * T * I / t;
  out.head = e * (n + T) * h + out.norm_stats + (e + 4) * T * V / t;
  out.head_transient =
      t == 1 ? (4 + e) * T * V : std::max(e * T * V / t, e * T * h - 4 * T * V / t);
  return out;
}

ActivationBytes head_activations(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const Shape x(m, j);
  ActivationBytes out;
  if (!recipe_traits(j.recipe).framework) {
    // The executor's head (executor_tensors).
    const ExecutorTensors t = executor_tensors(m, f.e, x.T, 1, false);
    out.saved = t.head;
    out.backward = t.head_transient;
    return out;
  }
  // The final norm and what the projection keeps of it.
  out.saved = final_norm_parts(m, j, f).total();
  add_loss_activations(out, x, j, f);
  return out;
}

}  // namespace shardplan::costmodel
