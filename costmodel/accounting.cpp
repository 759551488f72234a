#include "costmodel/accounting.hpp"
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

namespace {

// Tokens, widths and dtypes of one micro-batch, as doubles.
struct Shape {
  double s, T, h, q, kv, a, I, V, hd;
  Shape(const ModelSpec& m, const TrainingJob& j)
      : s(static_cast<double>(j.seq_len)),
        T(static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch)),
        h(static_cast<double>(m.hidden)), q(static_cast<double>(m.q_width())),
        kv(static_cast<double>(m.kv_width())), a(static_cast<double>(m.heads)),
        I(static_cast<double>(m.intermediate)), V(static_cast<double>(m.vocab)),
        hd(static_cast<double>(m.head_dim)) {}
};

// Megatron's GPT as Korthikanti et al. 2022 (Table 2) count it, per tensor for this architecture:
// with GPT-2's shapes (4h GELU MLP, dropout, MHA, LayerNorm) and 2-byte activations it gives the
// paper's s·b·h·(34 + 5·a·s/h) per layer. Flash attention keeps the fp32 logsumexp (a·s·b)
// instead of the a·s²·b scores; selective recompute drops the eager core. The executor's GPT
// (executor/gpt_model.hpp) keeps exactly these tensors.
ActivationBytes megatron_block(const ModelSpec& m, const TrainingJob& j, double e,
                               bool checkpointed) {
  const Shape x(m, j);
  const double T = x.T, h = x.h, q = x.q, kv = x.kv, a = x.a, s = x.s, I = x.I;
  // Inputs of the two norms (one shared input with GPT-NeoX's parallel residual).
  const double norms = (m.parallel_residual ? 1.0 : 2.0) * e * T * h;
  // QKV projection input, Q, K, V kept for the core, output projection input.
  double attention_outer = e * T * h + e * T * (q + 2 * kv) + e * T * q;
  // The attention core: softmax output (and dropout mask + output) per head, s×s per sequence.
  double core = 0;
  if (j.attention == AttentionImpl::eager) {
    core = e * a * s * T;
    if (m.attention_dropout) core += (1.0 + e) * a * s * T;
  } else {
    core = 4.0 * a * T;  // fp32 logsumexp per head and token (FlashAttention-2's saved stats)
  }
  if (m.residual_dropout) attention_outer += T * h;  // 1-byte mask after the attention output
  double mlp = m.mlp == MlpKind::gelu
                   ? e * T * h + 2 * e * T * I   // fc1 input; GELU input; fc2 input
                   : e * T * h + 3 * e * T * I;  // gate/up input; gate, up; down input
  if (m.residual_dropout) mlp += T * h;
  const double full = norms + attention_outer + core + mlp;
  ActivationBytes out;
  if (checkpointed) {
    out.saved = e * T * h;  // the block input only
    out.recompute = full;   // one block's activations rebuilt at a time in backward
  } else if (j.checkpointing == Checkpointing::selective_attention &&
             j.attention == AttentionImpl::eager) {
    out.saved = full - core;
  } else {
    out.saved = full;
  }
  return out;
}

// The executor's block on one rank without tensor or context parallelism (executor_tensors);
// full checkpointing keeps the block's input and rebuilds the rest, selective recompute drops the
// eager core.
ActivationBytes executor_block(const ModelSpec& m, const TrainingJob& j, double e,
                               bool checkpointed) {
  const Shape x(m, j);
  const ExecutorTensors t = executor_tensors(m, j, e, x.T, 1, false);
  ActivationBytes out;
  out.backward = t.block_transient;
  if (checkpointed) {
    out.saved = e * x.T * x.h;
    out.recompute = t.block;
  } else if (j.checkpointing == Checkpointing::selective_attention &&
             j.attention == AttentionImpl::eager) {
    out.saved = t.block - e * x.a * x.s * x.T;
  } else {
    out.saved = t.block;
  }
  return out;
}

// What the frameworks' own model code keeps, per tensor. Dtypes: e bytes of the compute dtype; p
// bytes of the parameters the block reads; r bytes of the residual stream, which carries the
// embedding's output dtype, the parameters' (fp32 under autocast, since an embedding lookup is
// not autocast; the compute dtype when FSDP or DeepSpeed hand the block 16-bit parameters).
// Under autocast (p > e) each GEMM casts its own input to the compute dtype and that cast is what
// its backward keeps; otherwise GEMMs reading one tensor share it.
struct Dtypes {
  double e, p, r;
  bool cuda;
  bool autocast() const { return p > e; }
  // What `consumers` GEMMs reading one norm output of dtype `out` keep.
  double gemm_inputs(int consumers, double out) const { return autocast() ? consumers * e : out; }
};

// An RMSNorm and what its consumers keep. transformers' LlamaRMSNorm: x.to(float32) (kept by
// pow), the fp32 rsqrt of the mean square per token, the normalized value cast back to the input
// dtype (kept by the weight multiply; fp32 in torchtitan's nn.RMSNorm, which multiplies before
// casting), then weight * normalized.
NormParts rmsnorm(const Shape& x, const Dtypes& d, int consumers, double normalized) {
  return {4 * x.T * x.h + 4 * x.T + normalized * x.T * x.h,
          d.gemm_inputs(consumers, std::max(d.p, d.r)) * x.T * x.h};
}
// torchtitan's nn.RMSNorm calls F.rms_norm: on CUDA the fused kernel (aten::_fused_rms_norm)
// keeps its input and the fp32 rstd per token; elsewhere it runs as ops (an fp32 copy of the
// input, rstd, the fp32 normalized value).
NormParts torch_rmsnorm(const Shape& x, const Dtypes& d, int consumers) {
  if (!d.cuda) return rmsnorm(x, d, consumers, 4.0);
  return {d.r * x.T * x.h + 4 * x.T, d.gemm_inputs(consumers, std::max(d.p, d.r)) * x.T * x.h};
}
// nn.LayerNorm (GPT-2, GPT-NeoX): its input, fp32 mean and rstd per token, and its consumers'.
NormParts layernorm(const Shape& x, const Dtypes& d, int consumers, bool keeps_input) {
  return {(keeps_input ? d.r * x.T * x.h : 0) + 8 * x.T,
          d.gemm_inputs(consumers, std::max(d.p, d.r)) * x.T * x.h};
}

// Dropout's mask per element: CUDA's native_dropout keeps a bool; on a CPU at::dropout keeps its
// scaled noise in the dropped tensor's dtype.
double dropout_mask(const Dtypes& d, double dtype) { return d.cuda ? 1.0 : dtype; }

// Tensors of the MLP's inner width (T·I elements of the compute dtype) that its activation and
// the down projection reading the activation's output keep, from the ops each activation runs
// (transformers/activations.py) and what their backward formulas save (torch's
// tools/autograd/derivatives.yaml): a product of two tensors keeps both, a product with or a sum
// of a Python number keeps nothing, tanh and sigmoid keep their result, pow, erf, gelu, silu
// and clamp their input, relu its result.
double mlp_inner_tensors(Activation a) {
  switch (a) {
  case Activation::silu:       // F.silu: its input; the down projection: the output
  case Activation::gelu:       // F.gelu: its input; the output
  case Activation::gelu_tanh:  // F.gelu(approximate="tanh"): the same two
    return 2;
  case Activation::gelu_new:
    // 0.5·x · (1 + tanh(c·(x + 0.044715·pow(x, 3)))): pow keeps x, tanh its result, the last
    // product 0.5·x and 1 + tanh; the output.
    return 5;
  case Activation::gelu_fast:
    // 0.5·x · (1 + tanh(x·0.797 · (1 + 0.044715·x · x))): (0.044715·x)·x keeps both factors,
    // (x·0.797)·(1 + ...) both, tanh its result, the last product 0.5·x and 1 + tanh; the output.
    return 8;
  case Activation::gelu_erf:
    // x·0.5 · (1 + erf(x / √2)): erf keeps x / √2, the product x·0.5 and 1 + erf; the output.
    return 4;
  case Activation::gelu_10:     // clip(gelu(x)): gelu keeps x, clamp the GELU; the output
  case Activation::quick_gelu:  // x · sigmoid(1.702·x): x and the sigmoid; the output
    return 3;
  case Activation::relu:      // its result, which the down projection reads as well
  case Activation::identity:  // the up projection's output, read by the down projection
    return 1;
  }
  return 0;
}

// Eager attention's probabilities: softmax runs in fp32 and keeps its output; the matmul with v
// keeps its cast to the compute dtype (when narrower) or, with attention dropout, the dropped
// probabilities and dropout its mask (the cast itself is then kept by nothing).
double eager_probabilities(const ModelSpec& m, const Shape& x, const Dtypes& d) {
  const double scores = x.a * x.s * x.T;
  if (m.attention_dropout) return (4 + dropout_mask(d, d.e) + d.e) * scores;
  return (4 + (d.e < 4 ? d.e : 0)) * scores;
}

// What sdpa's fused kernel keeps for backward besides q, k, v and its output, when it runs with
// is_causal and no mask (torch's tools/autograd/derivatives.yaml names what each kernel's backward
// reads; torch/_meta_registrations.py gives the shapes). On CUDA a 16-bit sdpa runs the flash
// kernel (_scaled_dot_product_flash_attention), with or without dropout: it keeps the fp32
// logsumexp [b, a, s], its philox rng_state (two 8-byte words) and an 8-byte unused word, and
// draws the dropout inside the kernel from that state in backward again, so no mask and no
// probabilities are kept (GPT-2's default attn_pdrop = 0.1 included). An fp32 sdpa runs the
// memory-efficient kernel (_scaled_dot_product_efficient_attention): its logsumexp is padded to
// a multiple of 32 queries, plus a philox seed and offset of 8 bytes each. The CPU kernel
// (_scaled_dot_product_flash_attention_for_cpu) keeps the logsumexp alone; with dropout the CPU
// takes sdpa's math path instead (set aside by the corpus comparison, not modelled). The random
// state's 16 to 24 bytes per block are left out.
double sdpa_kernel_state(const Shape& x, const Dtypes& d) {
  if (!d.cuda || d.e < 4) return 4 * x.a * x.T;
  const double b = x.T / x.s;
  return 4 * x.a * b * std::ceil(x.s / 32) * 32;
}

// Whether transformers hands sdpa an explicit mask: masking_utils._ignore_causal_mask_sdpa keeps
// the mask of a sliding window once the keys reach the window's length (kv_length >= window);
// otherwise sdpa runs with is_causal and no mask.
bool sdpa_gets_mask(const ModelSpec& m, const TrainingJob& j) {
  return recipe_traits(j.recipe).transformers_code && j.attention == AttentionImpl::flash &&
         m.sliding_window > 0 && j.seq_len >= m.sliding_window;
}

// The attention between the projections, for models whose projections are separate (Llama):
// sdpa keeps q, k, v, its output (read in place by o_proj) and an fp32 logsumexp per head and
// token. Eager (eager_attention_forward): the matmul keeps q and kᵀ, then the probabilities, the
// matmul with v keeps v, and o_proj keeps the contiguous transposed output.
//
// k and v reach the attention at the kv width or widened to every head. sdpa_attention_forward
// (transformers/integrations/sdpa_attention.py) leaves the grouping to sdpa (enable_gqa) when
// use_gqa_in_sdpa holds: no mask and head_dim <= 256. Otherwise, and always in eager, repeat_kv
// expands them to every head and reshapes: with one kv head the reshape merges a size-1 dim and
// stays a stride-0 view of the kv-width tensor; with more it copies. A view stays kv-wide unless
// its consumer copies it: autocast casting it to the compute dtype (k, rotated against the
// residual-dtype cos and sin, has the wider of the two dtypes; v comes out of v_proj in the
// compute dtype), or eager's torch.matmul folding [b, a] into one batch dim, a view only at b = 1.
//
// (These are transformers' paths; torchtitan's sdpa keeps the grouping with no mask.)
// With a sliding window sdpa also gets the mask: transformers' boolean [b, 1, s, s]; aten's
// scaled_dot_product_attention turns it into an additive mask of the query's (compute) dtype in
// every call (convert_boolean_attn_mask), and that is what the CPU kernel keeps for backward.
double llama_attention(const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, q = x.q, kv = x.kv, a = x.a, e = d.e;
  const bool flash = j.attention == AttentionImpl::flash;
  const bool mask = sdpa_gets_mask(m, j);
  const bool repeated =
      !flash || mask || (recipe_traits(j.recipe).transformers_code && m.head_dim > 256);
  // Widths of the k and v the attention keeps.
  double k_width = kv, v_width = kv;
  if (repeated && kv < q) {
    const bool view = m.kv_heads == 1 && (flash || j.micro_batch == 1);
    k_width = view && !d.autocast() ? kv : q;
    v_width = view ? kv : q;
  }
  const double kv_kept = e * T * (k_width + v_width);
  if (flash)
    return e * T * 2 * q + kv_kept + (mask ? 4 * a * T + e * x.T * x.s : sdpa_kernel_state(x, d));
  return 2 * e * T * q + kv_kept + eager_probabilities(m, x, d);
}

// LlamaDecoderLayer (Mistral and Qwen2 share its code; biases keep nothing more) and torchtitan's
// Llama TransformerBlock (fused wqkv: one GEMM reads the attention norm). LlamaMLP /
// FeedForward: SiLU keeps its input (gate out), the product keeps both factors, down_proj keeps
// the product.
BlockParts llama_block(const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double mlp_inner = m.mlp == MlpKind::swiglu ? 4 * d.e * x.T * x.I : 2 * d.e * x.T * x.I;
  const bool torch_norm = recipe_traits(j.recipe).rmsnorm == RmsNormCode::torch;
  const NormParts attention_norm = torch_norm ? torch_rmsnorm(x, d, 1) : rmsnorm(x, d, 3, d.r);
  const NormParts mlp_norm = torch_norm ? torch_rmsnorm(x, d, 2) : rmsnorm(x, d, 2, d.r);
  return {attention_norm.state + mlp_norm.state, attention_norm.output + mlp_norm.output,
          llama_attention(m, x, j, d) + mlp_inner, mlp_inner + mlp_norm.state + mlp_norm.output};
}

// GPT2Block: LayerNorms, one fused c_attn whose output q, k and v are views of (the whole
// storage stays); sdpa keeps them, its output (c_proj reads it in place) and its kernel's state
// (sdpa_kernel_state: on CUDA the random state its dropout is drawn from again in backward, not a
// mask); eager keeps the qkv storage, the probabilities and the merged heads c_proj reads. The MLP
// keeps what its activation_function keeps (mlp_inner_tensors). Residual dropout keeps a mask after
// attention and after the MLP.
BlockParts gpt2_block(const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, h = x.h, e = d.e;
  double attention = 3 * e * T * h;
  if (j.attention == AttentionImpl::flash)
    attention += e * T * h + sdpa_kernel_state(x, d);
  else
    attention += eager_probabilities(m, x, d) + e * T * h;
  const double residual_mask = m.residual_dropout ? dropout_mask(d, e) * T * h : 0;
  const NormParts ln_1 = layernorm(x, d, 1, true), ln_2 = layernorm(x, d, 1, true);
  const double mlp = mlp_inner_tensors(m.activation) * e * T * x.I;
  return {ln_1.state + ln_2.state + 2 * residual_mask, ln_1.output + ln_2.output, attention + mlp,
          mlp + ln_2.state + ln_2.output};
}

// llm-foundry's low_precision_layernorm (models/layers/norm.py, LPLayerNorm): under CUDA's
// autocast it casts its input, weight and bias to the compute dtype and runs layer_norm with
// autocast off, keeping the cast input, fp32 mean and rstd per token and the cast weight and bias;
// its output, in the compute dtype, is what the next linear keeps. Its cast helper asks
// torch.is_autocast_enabled(), which is CUDA's autocast: on a CPU it runs as nn.LayerNorm on the
// residual stream's dtype, keeping its input and the statistics in that dtype, and the linear
// keeps autocast's cast of its output, one per linear reading it (measured:
// tests/costmodel/data/oracle_mpt_units.json).
// Elements of a unit's tensors whose names start with `prefix`.
double elements_named(const UnitTensors& u, std::string_view prefix) {
  double n = 0;
  for (const auto& t : u.tensors)
    if (t.name.rfind(prefix, 0) == 0) n += static_cast<double>(t.elements());
  return n;
}

NormParts lp_layernorm(const Shape& x, const Dtypes& d, double weights, int consumers) {
  const bool casts = d.cuda && d.e < std::max(d.p, d.r);
  if (casts) return {d.e * x.T * x.h + 8 * x.T + d.e * weights, d.e * x.T * x.h};
  const double stats = d.cuda ? 8 * x.T : 2 * d.r * x.T;
  return {d.r * x.T * x.h + stats, d.gemm_inputs(consumers, d.r) * x.T * x.h};
}

// llm-foundry's LPRMSNorm (low_precision_rmsnorm, models/layers/norm.py): the same cast helper,
// then F.rms_norm(x, weight) and the result cast back to x's dtype. torch 2.7 (llm-foundry
// 0.22.0's pin) runs F.rms_norm as ops on every device: the input upcast to fp32 (or the fp32
// input itself), kept by the square and the normalizing product, the fp32 rsqrt per token, the
// fp32 normalized value the weight multiply keeps (measured on a CPU:
// tests/costmodel/data/oracle_mpt_units.json). Under CUDA's autocast (derived, not measured) the
// weight's cast is kept beside them, and the result's cast back to the fp32 residual is what
// each linear casts again and keeps.
NormParts lp_rmsnorm(const Shape& x, const Dtypes& d, double weights, int consumers) {
  const double state = 8 * x.T * x.h + 4 * x.T;
  if (d.cuda && d.e < std::max(d.p, d.r))
    return {state + d.e * weights, consumers * d.e * x.T * x.h};
  return {state, d.gemm_inputs(consumers, d.r) * x.T * x.h};
}

// MPT's norm_type, as modeled (mpt_unmodeled refuses the others).
NormParts mpt_norm(const ModelSpec& m, const Shape& x, const Dtypes& d, double weights,
                   int consumers) {
  return m.norm == NormKind::rmsnorm ? lp_rmsnorm(x, d, weights, consumers)
                                     : lp_layernorm(x, d, weights, consumers);
}

// llm-foundry's MPTBlock (models/layers/blocks.py, attention.py, ffn.py; 0.22.0): x + attn(
// norm_1(x)), then + ffn(norm_2(.)). The attention (GroupedQueryAttention with kv_n_heads = heads):
//   attn_impl torch (scaled_multihead_dot_product_attention): q·kᵀ keeps the fused Wqkv output
//     (q, k and v are views of it), masked_fill keeps a boolean causal mask [s, s] made in each
//     call, softmax its output and the matmul with v that output or its cast: in the compute
//     dtype on a CPU, in fp32 with the cast beside it under CUDA's autocast (softmax is in its
//     fp32 list) and wherever ALiBi's fp32 bias promotes the scores; out_proj keeps the
//     rearranged heads, a copy.
//   attn_impl flash (flash_attn_fn with flash-attn 2, derived from the source: not on a CPU):
//     bert_padding's index_first_axis copies q, k and v out of the fused output (which nothing
//     keeps), flash_attn_varlen_func keeps them, its output and the fp32 logsumexp per head and
//     token, and out_proj keeps pad_input's copy of the output.
// The FFN: mptmlp keeps what its activation keeps (mlp_inner_tensors), mptglu also the up
// projection's output and the product (down(act(gate(x)) · up(x))).
BlockParts mpt_block(const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, q = x.q, kv = x.kv, e = d.e;
  const double norm_weights =
      elements_named(m.block, "norm_1.");  // weight, and bias unless no_bias
  // The linears reading each norm: Wqkv (or Wq, Wk, Wv apart); up_proj (and mptglu's gate_proj).
  const bool fused = elements_named(m.block, "attn.Wqkv.") > 0;
  const NormParts norm_1 = mpt_norm(m, x, d, norm_weights, fused ? 1 : 3);
  const NormParts norm_2 = mpt_norm(m, x, d, norm_weights, m.mlp == MlpKind::swiglu ? 2 : 1);
  double attention = 0;
  if (j.attention == AttentionImpl::flash) {
    attention = e * T * (q + 2 * kv) + 2 * e * T * q + 4 * x.a * T;
  } else {
    const double scores = x.a * x.s * T;
    const bool fp32_scores = e < 4 && (d.cuda || m.positions == PositionKind::alibi);
    attention = e * T * (q + 2 * kv) + x.s * x.s + (fp32_scores ? 4 + e : e) * scores + e * T * q;
  }
  const double inner = mlp_inner_tensors(m.activation) + (m.mlp == MlpKind::swiglu ? 2 : 0);
  const double mlp = inner * e * T * x.I;
  return {norm_1.state + norm_2.state, norm_1.output + norm_2.output, attention + mlp,
          mlp + norm_2.state + norm_2.output};
}

// GPTNeoXLayer with the parallel residual: both LayerNorms read the block input (kept once). The
// fused query_key_value output stays whole (v is a view of it); rotary rebuilds q and k (kept by
// sdpa in the compute dtype); dense reads a contiguous copy of the attention output. The MLP
// keeps what its hidden_act keeps (mlp_inner_tensors).
BlockParts neox_block(const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, h = x.h, q = x.q, e = d.e;
  // Eager attention's matmul with v reads it as [b·a, s, d]: at b = 1 a view that keeps the whole
  // fused output alive, at b > 1 a copy of v alone.
  const double qkv =
      j.attention == AttentionImpl::eager && j.micro_batch > 1 ? e * T * q : 3 * e * T * q;
  double attention = qkv + 2 * e * T * q + e * T * h;
  if (j.attention == AttentionImpl::flash)
    attention += e * T * q + sdpa_kernel_state(x, d);
  else
    attention += eager_probabilities(m, x, d);
  const NormParts ln_1 = layernorm(x, d, 1, true);
  const NormParts ln_2 = layernorm(x, d, 1, !m.parallel_residual);
  const double residual_mask = m.residual_dropout ? 2 * dropout_mask(d, e) * T * h : 0;
  const double mlp = mlp_inner_tensors(m.activation) * e * T * x.I;
  return {ln_1.state + ln_2.state + residual_mask, ln_1.output + ln_2.output, attention + mlp,
          m.parallel_residual ? 0 : mlp + ln_2.state + ln_2.output};
}

BlockParts architecture_block(const ModelSpec& m, const Shape& x, const TrainingJob& j,
                              const Dtypes& d) {
  switch (m.architecture) {
  case Architecture::gpt2:
    return gpt2_block(m, x, j, d);
  case Architecture::gpt_neox:
    return neox_block(m, x, j, d);
  case Architecture::mpt:
    return mpt_block(m, x, j, d);
  case Architecture::llama:
  case Architecture::mistral:
  case Architecture::qwen2:
  case Architecture::uniform:
    break;
  }
  return llama_block(m, x, j, d);
}

// An MLP's backward, op by op as autograd runs it, each node's saved tensors released once it has
// run, at its largest moment, when of the block's weights only the down projection has its
// gradient. The down projection's backward makes the gradient of its input [T, I] and of its
// weight, and releases its saved input, the activation's output:
// - gated (transformers' LlamaMLP and its kin, torchtitan's FeedForward: down(act(gate(x)) *
//   up(x))): the product's backward (MulBackward0) makes the gradients of both factors [T, I]
//   while the product's gradient and the factors it saved are alive: 2·e·T·I beyond the block's
//   saved tensors (the down projection's input released: net 0). Measured: the stress corpus's
//   MQA Llama under full checkpointing peaks there (tests/costmodel/data/oracle_steps_stress.json).
// - gelu_new (GPT-2's default, 0.5·x · (1 + tanh(...)), mlp_inner_tensors): the last product's
//   backward makes the gradients of 0.5·x and of 1 + tanh beside the incoming gradient: three
//   [T, I] where the down projection's input was, 2·e·T·I beyond the saved tensors.
// - F.gelu, exact or tanh (one op keeping its input): the down projection's backward holds its
//   input's gradient beside the saved input and output, and GeluBackward its result beside the
//   input and the incoming gradient: e·T·I.
// Measured: GPT-2's FSDP2 steps peak inside the MLP's activation backward
// (tests/costmodel/data/oracle_steps.json, oracle_steps_stress.json's gpt2-h256-gelu). The other
// activations' chains are not derived here (0).
double mlp_backward_transient(const ModelSpec& m, const Shape& x, double e) {
  if (m.mlp == MlpKind::swiglu) return 2 * e * x.T * x.I;
  switch (m.activation) {
  case Activation::gelu_new:
    return 2 * e * x.T * x.I;
  case Activation::gelu:
  case Activation::gelu_tanh:
    return e * x.T * x.I;
  default:
    return 0;
  }
}

ActivationBytes framework_block(const ModelSpec& m, const TrainingJob& j, const Forward& f,
                                bool checkpointed) {
  const Shape x(m, j);
  const Dtypes d{f.e, f.p, f.p, f.cuda};
  const BlockParts parts = architecture_block(m, x, j, d);
  const double full = parts.total();
  ActivationBytes out;
  if (checkpointed) {
    out.saved = d.r * x.T * x.h;  // torch.utils.checkpoint keeps the block's input
    out.recompute = full;
    out.mlp_released = parts.mlp;
  } else if (j.checkpointing == Checkpointing::selective_op) {
    out.saved = selective_op_saved(m, j, f, 1, 1);
    // In backward the rest is rebuilt beside what was kept: the block's full set at once.
    out.recompute = std::max(0.0, full - out.saved);
  } else {
    out.saved = full;
    out.mlp_released = parts.mlp;
  }
  out.mlp_backward = mlp_backward_transient(m, x, f.e);
  return out;
}

}  // namespace

// torchtitan's SelectiveAC (torchtitan/distributed/activation_checkpoint.py, torchtitan 0.3.0):
// inside each block the outputs of attention and of the odd-numbered matmuls are saved (wqkv, w1,
// w2 of wqkv, wo, w1, w3, w2), everything else is recomputed; the block's input is kept. Under
// torchtitan's tensor parallelism its policy sees each rank's local ops, so each saved tensor is
// the rank's: the column-parallel wqkv and w1 outputs and the attention's a/t heads split by t,
// the row-parallel w2's output whole ([T, h], its partial sum before the all-reduce or the
// reduce-scatter, which the policy does not save), the block's input split by sp under sequence
// parallelism (measured: tests/costmodel/data/oracle_tp_units.json).
double selective_op_saved(const ModelSpec& m, const TrainingJob& j, const Forward& f, double t,
                          double sp) {
  const Shape x(m, j);
  const Dtypes d{f.e, f.p, f.p, f.cuda};
  const double e = f.e;
  const double qkv = x.q + 2 * x.kv;
  return d.r * x.T * x.h / sp + (e * x.T * (qkv + x.q + x.I) + 4 * x.a * x.T) / t + e * x.T * x.h;
}

std::string mpt_unmodeled(const ModelSpec& m, const TrainingJob& j) {
  if (m.architecture != Architecture::mpt) return "";
  if (!recipe_traits(j.recipe).runs_mpt)
    return fmt::format("MPT's model code is llm-foundry's: plan it with --recipe llm-foundry, not "
                       "{}",
                       documents::recipe_name(j.recipe));
  // What these keep is not measured (tests/costmodel/data/oracle_mpt_units.json has none of them).
  if (!m.unmeasured.empty()) return fmt::format("MPT's {} is not modeled yet", m.unmeasured);
  if (m.kv_heads < m.heads && j.attention == AttentionImpl::eager)
    return "MPT's grouped or multi-query attention under attn_impl torch (its repeated keys and "
           "values) is not modeled yet";
  return "";
}

BlockParts framework_block_parts(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  return architecture_block(m, Shape(m, j), j, Dtypes{f.e, f.p, f.p, f.cuda});
}

NormParts final_norm_parts(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const Shape x(m, j);
  const Dtypes d{f.e, f.p, f.p, f.cuda};
  switch (m.architecture) {
  case Architecture::gpt2:
  case Architecture::gpt_neox:
    return layernorm(x, d, 1, true);
  case Architecture::mpt:  // norm_f; the tied unembedding or lm_head keeps its output
    return mpt_norm(m, x, d, elements_named(m.head, "norm_f."), 1);
  default:
    break;
  }
  switch (recipe_traits(j.recipe).rmsnorm) {
  case RmsNormCode::fused:
    return {f.e * x.T * x.h, f.e * x.T * x.h};
  case RmsNormCode::torch:
    return torch_rmsnorm(x, d, 1);
  case RmsNormCode::upcast:
    break;
  }
  return rmsnorm(x, d, 1, d.r);
}

ActivationBytes block_activations(const ModelSpec& m, const TrainingJob& j, const Forward& f,
                                  bool checkpointed) {
  if (!recipe_traits(j.recipe).framework) return executor_block(m, j, f.e, checkpointed);
  if (recipe_traits(j.recipe).saved == SavedTensors::korthikanti)
    return megatron_block(m, j, f.e, checkpointed);
  return framework_block(m, j, f, checkpointed);
}

double rotary_table_bytes(const ModelSpec& m, const TrainingJob& j, double p) {
  // torchtitan keeps freqs_cis as a module buffer; Megatron's formula and the executor count
  // no table.
  if (m.positions != PositionKind::rotary || !recipe_traits(j.recipe).transformers_code) return 0;
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

ExecutorTensors executor_tensors(const ModelSpec& m, const TrainingJob& j, double e, double T,
                                 double t, bool sequence_parallel) {
  const double n = T / (sequence_parallel ? t : 1.0);
  const double s = static_cast<double>(j.seq_len), h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  const double I = static_cast<double>(m.intermediate), V = static_cast<double>(m.vocab);
  const double a = static_cast<double>(m.heads);
  const double mlp_width = m.mlp == MlpKind::gelu ? 2.0 : 3.0;
  const double core = j.attention == AttentionImpl::eager ? e * a * s * T : 4 * a * T;
  ExecutorTensors out;
  out.norm_stats = (m.norm == NormKind::layernorm ? 2.0 : 1.0) * 4 * n;
  out.block = e * n * h * (m.parallel_residual ? 3.0 : 4.0) + e * T * (2 * q + 2 * kv) / t +
              mlp_width * e * T * I / t + core / t + 2 * out.norm_stats;
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
    const ExecutorTensors t = executor_tensors(m, j, f.e, x.T, 1, false);
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
