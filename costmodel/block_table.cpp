// Over 800 lines: every model code's per-op table beside the row helpers they share (the norms,
// the attention, the MLP activations), so that a table reads its tensors in one place.
#include "costmodel/block_table.hpp"
#include "costmodel/block_linears.hpp"
#include "costmodel/selective_op.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/recipe.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::costmodel {

using documents::Activation;
using documents::Architecture;
using documents::AttentionImpl;
using documents::Checkpointing;
using documents::MlpKind;
using documents::ModelSpec;
using documents::NormKind;
using documents::PositionKind;
using documents::QkNorm;
using documents::recipe_traits;
using documents::RmsNormCode;
using documents::SavedTensors;
using documents::TrainingJob;
using documents::UnitTensors;
using enum Placement;

Shape::Shape(const ModelSpec& m, const TrainingJob& j)
    : s(static_cast<double>(j.seq_len)),
      T(static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch)),
      h(static_cast<double>(m.hidden)), q(static_cast<double>(m.q_width())),
      kv(static_cast<double>(m.kv_width())), a(static_cast<double>(m.heads)),
      I(static_cast<double>(m.intermediate)), V(static_cast<double>(m.vocab)),
      hd(static_cast<double>(m.head_dim)) {}

namespace {

// Appends a table's rows; `mlp` marks those the MLP's backward releases first.
struct Rows {
  std::vector<SavedTensor>& out;
  bool mlp = false;
  void add(const char* op, const char* tensor, double bytes, Placement place, bool core = false) {
    if (bytes != 0) out.push_back({op, tensor, bytes, place, mlp, core});
  }
};

// ---- Megatron-core's GPT (SavedTensors::korthikanti) --------------------------------------------

// Korthikanti et al. 2022, §4.1 and Table 2, per tensor for this architecture: with GPT-2's shapes
// (4h GELU MLP, dropout, MHA, LayerNorm) and 2-byte activations the rows add up to the paper's
// s·b·h·(34 + 5·a·s/h) per layer. Flash attention keeps the fp32 logsumexp (a·s·b) instead of
// the a·s²·b scores. SwiGLU keeps the fused swiglu's input (gate and up side by side) and the
// down projection's input (megatron/core/fusions/fused_bias_swiglu.py). The executor's GPT
// (executor/gpt_model.hpp) keeps the same tensors as executor_rows counts them.
void korthikanti_rows(Rows& r, const ModelSpec& m, const TrainingJob& j, const Shape& x, double e) {
  const double T = x.T, h = x.h, scores = x.a * x.s * T;
  r.add("input_layernorm", "input", e * T * h, residual);
  r.add("linear_qkv", "input", e * T * h, linear_input);
  r.add("core_attention", "q, k, v", e * T * (x.q + 2 * x.kv), heads);
  if (j.attention == AttentionImpl::eager) {
    r.add("core_attention", "softmax output", e * scores, heads, true);
    if (m.attention_dropout) {
      r.add("core_attention", "dropout mask", scores, heads, true);
      r.add("core_attention", "dropped probabilities", e * scores, heads, true);
    }
  } else {
    r.add("core_attention", "fp32 logsumexp", 4 * x.a * T, heads);
  }
  r.add("linear_proj", "input", e * T * x.q, heads);
  if (m.residual_dropout) r.add("attention dropout", "mask", T * h, residual);
  if (!m.parallel_residual) r.add("pre_mlp_layernorm", "input", e * T * h, residual);
  r.add("linear_fc1", "input", e * T * h, linear_input);
  if (m.mlp == MlpKind::gelu) {
    r.add("gelu", "input", e * T * x.I, heads);
  } else {
    r.add("swiglu", "input (gate and up)", 2 * e * T * x.I, heads);
  }
  r.add("linear_fc2", "input", e * T * x.I, heads);
  if (m.residual_dropout) r.add("mlp dropout", "mask", T * h, residual);
}

// The executor's block (executor/gpt_model.hpp; with t > 1 executor/tensor_parallel_block.cpp,
// with c > 1 context_parallel_block.cpp): no dropout; each norm's fp32 statistics (rstd, and the
// mean for LayerNorm) per token; the block's input, the norms' outputs and (sequential residual)
// the attention's residual sum; q, k, v and the projection's input; the MLP's [T, I] tensors (2,
// SwiGLU 3); the attention core. Under tensor parallelism it keeps the sequence shards of what
// lies on the residual stream, as Megatron-core does.
void executor_rows(Rows& r, const ModelSpec& m, const TrainingJob& j, const Shape& x, double e) {
  const double T = x.T, h = x.h;
  const double stats = (m.norm == NormKind::layernorm ? 2.0 : 1.0) * 4 * T;
  r.add("block", "input", e * T * h, residual);
  r.add("norm1", "fp32 statistics", stats, residual);
  r.add("norm1", "output", e * T * h, linear_input);
  r.add("attention", "q, k, v", e * T * (x.q + 2 * x.kv), heads);
  if (j.attention == AttentionImpl::eager)
    r.add("attention", "probabilities", e * x.a * x.s * T, heads, true);
  else
    r.add("attention", "fp32 logsumexp", 4 * x.a * T, heads);
  r.add("out_proj", "input", e * T * x.q, heads);
  if (!m.parallel_residual) r.add("attention residual", "sum", e * T * h, residual);
  r.add("norm2", "fp32 statistics", stats, residual);
  r.add("norm2", "output", e * T * h, linear_input);
  r.add("mlp", m.mlp == MlpKind::gelu ? "GELU's input and output" : "gate, up and their product",
        (m.mlp == MlpKind::gelu ? 2.0 : 3.0) * e * T * x.I, heads);
}

// ---- The frameworks' model code, per op (SavedTensors::per_op) ----------------------------------

// An RMSNorm and what its consumers keep. transformers' LlamaRMSNorm: x.to(float32) (kept by
// pow), the fp32 rsqrt of the mean square per token, the normalized value cast back to the input
// dtype (kept by the weight multiply; fp32 in torchtitan's nn.RMSNorm, which multiplies before
// casting), then weight * normalized.
void rmsnorm(Rows& r, const char* op, const Shape& x, const Dtypes& d, int consumers,
             double normalized) {
  r.add(op, "input in fp32", 4 * x.T * x.h, residual);
  r.add(op, "fp32 rstd", 4 * x.T, residual);
  r.add(op, "normalized", normalized * x.T * x.h, residual);
  r.add(op, "output, as the linears after it keep it",
        d.gemm_inputs(consumers, std::max(d.p, d.r)) * x.T * x.h, linear_input);
}
// torchtitan's nn.RMSNorm calls F.rms_norm: on CUDA the fused kernel (aten::_fused_rms_norm)
// keeps its input and the fp32 rstd per token; elsewhere it runs as ops (an fp32 copy of the
// input, rstd, the fp32 normalized value).
void torch_rmsnorm(Rows& r, const char* op, const Shape& x, const Dtypes& d, int consumers) {
  if (!d.cuda) return rmsnorm(r, op, x, d, consumers, 4.0);
  r.add(op, "input", d.r * x.T * x.h, residual);
  r.add(op, "fp32 rstd", 4 * x.T, residual);
  r.add(op, "output, as the linears after it keep it",
        d.gemm_inputs(consumers, std::max(d.p, d.r)) * x.T * x.h, linear_input);
}
// nn.LayerNorm (GPT-2, GPT-NeoX): its input, fp32 mean and rstd per token, and its consumers'.
void layernorm(Rows& r, const char* op, const Shape& x, const Dtypes& d, int consumers,
               bool keeps_input) {
  if (keeps_input) r.add(op, "input", d.r * x.T * x.h, residual);
  r.add(op, "fp32 mean and rstd", 8 * x.T, residual);
  r.add(op, "output, as the linears after it keep it",
        d.gemm_inputs(consumers, std::max(d.p, d.r)) * x.T * x.h, linear_input);
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
void activation_rows(Rows& r, const char* op, const ModelSpec& m, const Shape& x, double e,
                     double more = 0) {
  r.add(op, "the activation's tensors and the down projection's input",
        (mlp_inner_tensors(m.activation) + more) * e * x.T * x.I, heads);
}

// Eager attention's probabilities: softmax runs in fp32 and keeps its output; the matmul with v
// keeps its cast to the compute dtype (when narrower) or, with attention dropout, the dropped
// probabilities and dropout its mask (the cast itself is then kept by nothing).
void eager_probabilities(Rows& r, const ModelSpec& m, const Shape& x, const Dtypes& d) {
  const double scores = x.a * x.s * x.T;
  r.add("softmax", "fp32 output", 4 * scores, heads, true);
  if (m.attention_dropout) {
    r.add("attention dropout", "mask", dropout_mask(d, d.e) * scores, heads, true);
    r.add("attention dropout", "dropped probabilities", d.e * scores, heads, true);
  } else if (d.e < 4) {
    r.add("probabilities @ v", "probabilities cast", d.e * scores, heads, true);
  }
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
void llama_attention(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j,
                     const Dtypes& d) {
  const double T = x.T, e = d.e;
  const bool flash = j.attention == AttentionImpl::flash;
  const bool mask = sdpa_gets_mask(m, j);
  const bool repeated =
      !flash || mask || (recipe_traits(j.recipe).transformers_code && m.head_dim > 256);
  // Widths of the k and v the attention keeps.
  double k_width = x.kv, v_width = x.kv;
  if (repeated && x.kv < x.q) {
    const bool view = m.kv_heads == 1 && (flash || j.micro_batch == 1);
    k_width = view && !d.autocast() ? x.kv : x.q;
    v_width = view ? x.kv : x.q;
  }
  const char* op = flash ? "sdpa" : "eager attention";
  r.add(op, "q", e * T * x.q, heads);
  r.add(op, "k", e * T * k_width, heads);
  r.add(op, "v", e * T * v_width, heads);
  if (flash && mask) {
    r.add(op, "fp32 logsumexp", 4 * x.a * T, heads);
    r.add(op, "additive mask", e * T * x.s, heads);
  } else if (flash) {
    r.add(op, "kernel state", sdpa_kernel_state(x, d), heads);
  } else {
    eager_probabilities(r, m, x, d);
  }
  r.add("o_proj", "input", e * T * x.q, heads);
}

// torchtitan's TransformerBlock compiled as its apply_compile does it (torchtitan 0.3.0,
// torchtitan/distributed/compile.py: each block on its own, backend inductor, fullgraph):
// AOTAutograd's min-cut partitioner keeps what backward needs that is costly to recompute and
// recomputes the pointwise rest. Measured per tensor with saved_tensors_hooks around the compiled
// block on a CPU (tests/costmodel/data/oracle_compile_units.json; the partition is made before
// Inductor lowers the graph to C++ or Triton kernels): the block's input and the residual after
// the attention (the norms' inputs) with each norm's fp32 rstd and output (the linears' input);
// q, k and v as the attention reads them (rotated), its output and fp32 logsumexp; the outputs of
// w1 and w3 and their product (w2's input). Not kept: the fp32 copies inside the norms, the wqkv
// output before rotation, wo's input (a view of the attention output, rebuilt), SiLU's output.
void compiled_llama_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j,
                         const Dtypes& d) {
  const double T = x.T, h = x.h, e = d.e;
  // With every linear of the block in Float8 (torchao's Float8Linear, rowwise or tensorwise alike;
  // tests/costmodel/data/oracle_float8_units.json) the partition keeps neither norm's output nor
  // w2's input: backward casts its own fp8 operands again from the norms' inputs and rstd and
  // from w1's and w3's outputs, and it keeps wo's output in place of the residual after the
  // attention (its sum with the block input is recomputed).
  const bool fp8 = float8_whole_block(m, j);
  r.add("attention_norm", "input (the block's)", d.r * T * h, residual);
  r.add("attention_norm", "fp32 rstd", 4 * T, residual);
  if (!fp8) r.add("attention_norm", "output (wqkv's input)", e * T * h, linear_input);
  r.add("sdpa", "rotated q, k and v", e * T * (x.q + 2 * x.kv), heads);
  r.add("sdpa", "output", e * T * x.q, heads);
  r.add("sdpa", "kernel state", sdpa_kernel_state(x, d), heads);
  r.mlp = true;
  if (fp8)
    r.add("wo", "output (the residual's other term)", e * T * h, residual);
  else
    r.add("ffn_norm", "input (the residual after attention)", d.r * T * h, residual);
  r.add("ffn_norm", "fp32 rstd", 4 * T, residual);
  if (!fp8) r.add("ffn_norm", "output (w1's and w3's input)", e * T * h, linear_input);
  const double factors = m.mlp == MlpKind::swiglu ? 2.0 : 1.0;
  r.add("feed_forward", fp8 ? "w1's and w3's outputs" : "w1's and w3's outputs and their product",
        (fp8 ? factors : factors + 1) * e * T * x.I, heads);
}

// LlamaDecoderLayer (Mistral and Qwen2 share its code; biases keep nothing more) and torchtitan's
// Llama TransformerBlock (fused wqkv: one GEMM reads the attention norm). LlamaMLP /
// FeedForward: SiLU keeps its input (gate out), the product keeps both factors, down_proj keeps
// the product.
void llama_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j,
                const Dtypes& d) {
  if (j.compile) return compiled_llama_rows(r, m, x, j, d);
  const bool torch_norm = recipe_traits(j.recipe).rmsnorm == RmsNormCode::torch;
  if (torch_norm)
    torch_rmsnorm(r, "attention_norm", x, d, 1);
  else
    rmsnorm(r, "input_layernorm", x, d, 3, d.r);
  llama_attention(r, m, x, j, d);
  r.mlp = true;
  if (torch_norm)
    torch_rmsnorm(r, "ffn_norm", x, d, 2);
  else
    rmsnorm(r, "post_attention_layernorm", x, d, 2, d.r);
  const double TI = d.e * x.T * x.I;
  if (m.mlp == MlpKind::swiglu) {
    r.add("silu", "input (gate_proj's output)", TI, heads);
    r.add("silu * up", "silu's output", TI, heads);
    r.add("silu * up", "up_proj's output", TI, heads);
    r.add("down_proj", "input (the product)", TI, heads);
  } else {
    r.add("act_fn", "input", TI, heads);
    r.add("down_proj", "input", TI, heads);
  }
}

// The norms on q and k of Qwen3-MoE (per head) and OLMoE (over the whole q and k): each an
// upcast RMSNorm (rmsnorm above) of the projection's output, statistics per head or per token,
// the normalized value cast back to the projection's dtype.
void qk_norm_rows(Rows& r, const ModelSpec& m, const Shape& x, const Dtypes& d) {
  const bool per_head = m.qk_norm == QkNorm::head;
  const double kv_heads = static_cast<double>(m.kv_heads);
  r.add("q_norm", "input in fp32", 4 * x.T * x.q, heads);
  r.add("q_norm", "fp32 rstd", 4 * x.T * (per_head ? x.a : 1), heads);
  r.add("q_norm", "normalized", d.e * x.T * x.q, heads);
  r.add("k_norm", "input in fp32", 4 * x.T * x.kv, heads);
  r.add("k_norm", "fp32 rstd", 4 * x.T * (per_head ? kv_heads : 1), heads);
  r.add("k_norm", "normalized", d.e * x.T * x.kv, heads);
}

// transformers 5.23's sparse MLP (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock,
// Qwen3MoeSparseMoeBlock, OlmoeSparseMoeBlock) on its default experts path, grouped_mm
// (integrations/moe.py, grouped_mm_experts_forward), per tensor as measured in
// tests/costmodel/data/oracle_moe_units.json. The router (mlp.gate) keeps its input (the norm's
// output as its consumers keep it, above), its fp32 softmax [T, E] and the top-k indices
// [T, k] (int64); renormalizing the k weights (Mixtral always, the others under norm_topk_prob)
// keeps their fp32 sum [T, 1] and the weights [T, k]. The experts sort the k·T (token, expert)
// pairs: three int64 index vectors [kT] and int32 offsets [E]; the gathered rows [kT, h], the
// gate_up output [kT, 2I], silu's output and the product [kT, I] each, the down output [kT, h]
// in the weights' dtype (grouped_mm is not autocast: under autocast with fp32 weights the experts
// run in fp32), and the routing weights [kT, 1] (fp32 in Mixtral, which keeps the softmax's
// dtype; the router logits' dtype elsewhere). Tokens per expert change no total: every shape
// counts the k·T pairs. Qwen2-MoE's shared expert is a SwiGLU of its own width S (gate and up
// outputs, silu's output, the product) whose output [T, h] is kept for the sigmoid gate's product,
// and the sigmoid [T, 1].
void moe_mlp_rows(Rows& r, const ModelSpec& m, const Shape& x, const Dtypes& d) {
  const auto& moe = m.moe;
  const double T = x.T, E = static_cast<double>(moe.experts), k = static_cast<double>(moe.top_k);
  const double kT = k * T, w = std::max(d.p, d.e);  // the experts' dtype: their weights'
  r.add("router", "fp32 softmax", 4 * T * E, heads);
  r.add("router", "top-k indices", 8 * T * k, heads);
  if (moe.normalize_top_k) {
    r.add("router", "fp32 sum of the top-k weights", 4 * T, heads);
    r.add("router", "fp32 top-k weights", 4 * T * k, heads);
  }
  r.add("experts", "sort and gather indices", 3 * 8 * kT, heads);
  r.add("experts", "offsets per expert", 4 * E, heads);
  r.add("experts", "gathered rows", w * kT * x.h, heads);
  r.add("experts", "gate_up output", 2 * w * kT * x.I, heads);
  r.add("experts", "silu's output and the product", 2 * w * kT * x.I, heads);
  r.add("experts", "routing weights", (moe.fp32_routing_weights ? 4 : d.e) * kT, heads);
  r.add("experts", "down output", w * kT * x.h, heads);
  if (moe.shared_intermediate > 0) {
    const double S = static_cast<double>(moe.shared_intermediate);
    r.add("shared_expert", "gate and up outputs, silu's output and the product", 4 * d.e * T * S,
          heads);
    r.add("shared_expert", "output", d.e * T * x.h, heads);
  }
  if (moe.shared_gate) r.add("shared_expert_gate", "sigmoid", d.e * T, heads);
}

// A mixture of experts' decoder layer: the Llama family's attention (with Qwen3-MoE's or OLMoE's
// q/k norms) and its sparse MLP, whose norm's output the router (and Qwen2-MoE's shared expert
// gate and up projections and its shared_expert_gate) read.
void moe_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  rmsnorm(r, "input_layernorm", x, d, 3, d.r);
  if (m.qk_norm != QkNorm::none) qk_norm_rows(r, m, x, d);
  llama_attention(r, m, x, j, d);
  r.mlp = true;
  rmsnorm(r, "post_attention_layernorm", x, d, m.moe.input_gemms(), d.r);
  moe_mlp_rows(r, m, x, d);
}

// GPT2Block: LayerNorms, one fused c_attn whose output q, k and v are views of (the whole
// storage stays); sdpa keeps them, its output (c_proj reads it in place) and its kernel's state
// (sdpa_kernel_state: on CUDA the random state its dropout is drawn from again in backward, not a
// mask); eager keeps the qkv storage, the probabilities and the merged heads c_proj reads. The MLP
// keeps what its activation_function keeps (mlp_inner_tensors). Residual dropout keeps a mask after
// attention and after the MLP.
void gpt2_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, h = x.h, e = d.e;
  const double residual_mask = m.residual_dropout ? dropout_mask(d, e) * T * h : 0;
  layernorm(r, "ln_1", x, d, 1, true);
  r.add("c_attn", "output (q, k, v views)", 3 * e * T * h, heads);
  if (j.attention == AttentionImpl::flash) {
    r.add("sdpa", "output (c_proj's input)", e * T * h, heads);
    r.add("sdpa", "kernel state", sdpa_kernel_state(x, d), heads);
  } else {
    eager_probabilities(r, m, x, d);
    r.add("c_proj", "merged heads", e * T * h, heads);
  }
  r.add("resid_dropout", "mask", residual_mask, residual);
  r.mlp = true;
  layernorm(r, "ln_2", x, d, 1, true);
  activation_rows(r, "mlp", m, x, e);
  r.mlp = false;
  r.add("mlp dropout", "mask", residual_mask, residual);
}

// llm-foundry's low_precision_layernorm (models/layers/norm.py, LPLayerNorm): under CUDA's
// autocast it casts its input, weight and bias to the compute dtype and runs layer_norm with
// autocast off, keeping the cast input, fp32 mean and rstd per token and the cast weight and bias;
// its output, in the compute dtype, is what the next linear keeps. Its cast helper asks
// torch.is_autocast_enabled(), which is CUDA's autocast: on a CPU it runs as nn.LayerNorm on the
// residual stream's dtype, keeping its input and the statistics in that dtype, and the linear
// keeps autocast's cast of its output, one per linear reading it (measured:
// tests/costmodel/data/oracle_mpt_units.json).
void lp_layernorm(Rows& r, const char* op, const Shape& x, const Dtypes& d, double weights,
                  int consumers) {
  if (d.cuda && d.e < std::max(d.p, d.r)) {
    r.add(op, "input cast", d.e * x.T * x.h, residual);
    r.add(op, "fp32 mean and rstd", 8 * x.T, residual);
    r.add(op, "weight and bias cast", d.e * weights, residual);
    r.add(op, "output", d.e * x.T * x.h, linear_input);
    return;
  }
  r.add(op, "input", d.r * x.T * x.h, residual);
  r.add(op, "mean and rstd", d.cuda ? 8 * x.T : 2 * d.r * x.T, residual);
  r.add(op, "output, as the linears after it keep it", d.gemm_inputs(consumers, d.r) * x.T * x.h,
        linear_input);
}

// llm-foundry's LPRMSNorm (low_precision_rmsnorm, models/layers/norm.py): the same cast helper,
// then F.rms_norm(x, weight) and the result cast back to x's dtype. torch 2.7 (llm-foundry
// 0.22.0's pin) runs F.rms_norm as ops on every device: the input upcast to fp32 (or the fp32
// input itself), kept by the square and the normalizing product, the fp32 rsqrt per token, the
// fp32 normalized value the weight multiply keeps (measured on a CPU:
// tests/costmodel/data/oracle_mpt_units.json). Under CUDA's autocast (derived, not measured) the
// weight's cast is kept beside them, and the result's cast back to the fp32 residual is what
// each linear casts again and keeps.
void lp_rmsnorm(Rows& r, const char* op, const Shape& x, const Dtypes& d, double weights,
                int consumers) {
  r.add(op, "input in fp32", 4 * x.T * x.h, residual);
  r.add(op, "fp32 rstd", 4 * x.T, residual);
  r.add(op, "fp32 normalized", 4 * x.T * x.h, residual);
  const bool casts = d.cuda && d.e < std::max(d.p, d.r);
  if (casts) r.add(op, "weight cast", d.e * weights, residual);
  r.add(op, "output, as the linears after it keep it",
        (casts ? consumers * d.e : d.gemm_inputs(consumers, d.r)) * x.T * x.h, linear_input);
}

// Elements of a unit's tensors whose names start with `prefix`.
double elements_named(const UnitTensors& u, std::string_view prefix) {
  double n = 0;
  for (const auto& t : u.tensors)
    if (t.name.rfind(prefix, 0) == 0) n += static_cast<double>(t.elements());
  return n;
}

// MPT's norm_type, as modeled (mpt_unmodeled refuses the others).
void mpt_norm(Rows& r, const char* op, const ModelSpec& m, const Shape& x, const Dtypes& d,
              double weights, int consumers) {
  if (m.norm == NormKind::rmsnorm)
    lp_rmsnorm(r, op, x, d, weights, consumers);
  else
    lp_layernorm(r, op, x, d, weights, consumers);
}

// MPT's q, k and v as attn_impl torch keeps them (models/layers/attention.py, 0.22.0), storage by
// storage (a view keeps its whole storage; each counted once). They come out of the fused Wqkv
// (one [T, q + 2kv] output split into views) or Wq, Wk and Wv apart, then in turn:
//   clip_qkv: qkv.clamp keeps its input; q, k, v become views of the clamped output
//   qk_ln / qk_gn: q_ln and k_ln (LPLayerNorm over the widths, or per head) keep their inputs
//     (views of the q and k storages) and their statistics; q and k become the norms' outputs
//     (`.to(dtype)`: the compute dtype)
//   rope_impl hf (transformers' apply_rotary_pos_emb): the products keep cos and sin
//     [s, hd] in the compute dtype (LlamaRotaryEmbedding casts them to v's dtype), made again in
//     every block; q and k become q_embed and k_embed. rope_impl dail rotates in place (below).
//   scaled_multihead_dot_product_attention: with 1 < kv_n_heads < n_heads, repeat_kv_for_gqa's
//     reshape copies k and v out to every head [T, q] (its expand is a view); the matmuls then
//     read q, kᵀ and v through torch.matmul's reshape to [b·a, ...]: at b = 1 a view of what they
//     came from (a repeated copy, a norm's output, q_embed or the projections' output), at b > 1
//     a copy [T, q] each (a single kv head broadcast to every head included).
// Measured on a CPU (tests/costmodel/data/oracle_mpt_units.json: MHA, GQA, MQA, qk_ln, qk_gn,
// clip_qkv, rope hf); rope dail and, under flash, the same steps before flash_attn_fn's copies,
// derived from the sources (CUDA only).
void mpt_qkv(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d,
             bool fused) {
  const double e = d.e, T = x.T;
  // Storages by name, their widths per token; `kept` those autograd holds.
  struct Storage {
    const char* name;
    double width;
    bool kept = false;
  };
  std::vector<Storage> storages;
  storages.reserve(12);
  auto storage = [&](const char* name, double width) {
    storages.push_back({name, width});
    return storages.size() - 1;
  };
  std::size_t q = 0, k = 0, v = 0;
  auto project = [&](const char* fused_name, const char* q_name, const char* k_name,
                     const char* v_name) {
    if (fused) {
      q = k = v = storage(fused_name, x.q + 2 * x.kv);
    } else {
      q = storage(q_name, x.q);
      k = storage(k_name, x.kv);
      v = storage(v_name, x.kv);
    }
  };
  project("Wqkv's output", "Wq's output", "Wk's output", "Wv's output");
  if (m.clip_qkv) {
    for (const auto i : {q, k, v}) storages[i].kept = true;  // the clamp's input
    project("the clamped qkv", "the clamped q", "the clamped k", "the clamped v");
  }
  if (m.qk_norm != QkNorm::none) {
    storages[q].kept = storages[k].kept = true;  // q_ln's and k_ln's inputs
    // Mean and rstd per token (per head and token under qk_gn): fp32 on CUDA, the dtype of the
    // norm's weights on a CPU (LPLayerNorm casts only under CUDA's autocast, lp_layernorm);
    // under CUDA's autocast the weights' casts are kept beside them.
    const double per_token = m.qk_norm == QkNorm::head ? x.a + x.kv / x.hd : 2;  // norms
    r.add("q_ln, k_ln", "mean and rstd", 2 * (d.cuda ? 4 : d.r) * T * per_token, heads);
    if (d.cuda && d.autocast())
      r.add("q_ln, k_ln", "weight and bias casts",
            d.e * (elements_named(m.block, "attn.q_ln.") + elements_named(m.block, "attn.k_ln.")),
            heads);
    q = storage("q_ln's output", x.q);
    k = storage("k_ln's output", x.kv);
  }
  if (m.positions == PositionKind::rotary && m.rope_in_place) {
    // rope_impl dail (derived from flash-attn 2's flash_attn/layers/rotary.py, not measured: its
    // kernel needs CUDA): torch.stack([k, v], 2) makes one [T, 2kv] tensor (StackBackward0 keeps
    // nothing); ApplyRotaryEmb rotates q in place in its storage and ApplyRotaryEmbKV_ k in
    // place in the stack, both keeping only the module's cos and sin cache [S, hd/2] (one per
    // model, shared by every block: left out); unbind gives k and v as views of the stack.
    k = v = storage("the stacked k and v", 2 * x.kv);
  } else if (m.positions == PositionKind::rotary) {
    r.add("apply_rotary_pos_emb", "cos and sin", 2 * e * x.s * x.hd, heads);
    q = storage("q_embed", x.q);
    k = storage("k_embed", x.kv);
  }
  if (j.attention == AttentionImpl::flash) {
    // flash_attn_fn's index_first_axis copies q, k and v; what they came from is kept only by
    // the steps above.
    r.add("flash_attn_varlen_func", "q, k, v (index_first_axis' copies)", e * T * (x.q + 2 * x.kv),
          heads);
  } else if (j.micro_batch > 1) {
    r.add("q @ k^T, probabilities @ v", "q, k and v copied to every head", 3 * e * T * x.q, heads);
  } else {
    const bool repeated = m.kv_heads > 1 && m.kv_heads < m.heads;
    storages[q].kept = true;
    if (repeated)
      r.add("repeat_kv_for_gqa", "k and v copied to every head", 2 * e * T * x.q, heads);
    else
      storages[k].kept = storages[v].kept = true;
  }
  for (const auto& s : storages)
    if (s.kept) r.add("attention", s.name, e * T * s.width, heads);
}

// llm-foundry's MPTBlock (models/layers/blocks.py, attention.py, ffn.py; 0.22.0): x + attn(
// norm_1(x)), then + ffn(norm_2(.)). The attention (GroupedQueryAttention; q, k and v: mpt_qkv):
//   attn_impl torch (scaled_multihead_dot_product_attention): masked_fill keeps a boolean causal
//     mask [s, s] made in each call, softmax its output and the matmul with v that output or its
//     cast: in the compute dtype on a CPU, in fp32 with the cast beside it under CUDA's autocast
//     (softmax is in its fp32 list) and wherever ALiBi's fp32 bias promotes the scores; out_proj
//     keeps the rearranged heads, a copy.
//   attn_impl flash (flash_attn_fn with flash-attn 2, derived from the source: not on a CPU):
//     flash_attn_varlen_func keeps its copies of q, k and v, its output and the fp32 logsumexp
//     per head and token, and out_proj keeps pad_input's copy of the output.
// The FFN: mptmlp keeps what its activation keeps (mlp_inner_tensors), mptglu also the up
// projection's output and the product (down(act(gate(x)) · up(x))).
void mpt_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, e = d.e;
  const double norm_weights =
      elements_named(m.block, "norm_1.");  // weight, and bias unless no_bias
  // The linears reading each norm: Wqkv (or Wq, Wk, Wv apart); up_proj (and mptglu's gate_proj).
  const bool fused = elements_named(m.block, "attn.Wqkv.") > 0;
  mpt_norm(r, "norm_1", m, x, d, norm_weights, fused ? 1 : 3);
  mpt_qkv(r, m, x, j, d, fused);
  if (j.attention == AttentionImpl::flash) {
    r.add("flash_attn_varlen_func", "output", e * T * x.q, heads);
    r.add("flash_attn_varlen_func", "fp32 logsumexp", 4 * x.a * T, heads);
    r.add("out_proj", "input (pad_input's copy)", e * T * x.q, heads);
  } else {
    const double scores = x.a * x.s * T;
    const bool fp32_scores = e < 4 && (d.cuda || m.positions == PositionKind::alibi);
    r.add("masked_fill", "causal mask", x.s * x.s, heads);
    r.add("softmax", fp32_scores ? "fp32 output and its cast" : "output",
          (fp32_scores ? 4 + e : e) * scores, heads, true);
    // attn_pdrop: F.dropout(inplace=True) on the probabilities. ATen's in-place dropout_ never
    // takes the fused native_dropout (out-of-place dropout alone does), so on either device it
    // multiplies by a scaled noise tensor of the probabilities' dtype, which the product keeps.
    if (m.attention_dropout)
      r.add("dropout_", "scaled noise", (fp32_scores ? 4 : e) * scores, heads, true);
    r.add("out_proj", "input (the rearranged heads)", e * T * x.q, heads);
  }
  // resid_pdrop: nn.Dropout on the attention's and the FFN's outputs (out-of-place: a bool mask
  // under CUDA's native_dropout). flash-attn's own dropout (attn_pdrop under attn_impl flash)
  // keeps its RNG state, not a mask.
  if (m.residual_dropout)
    r.add("resid_attn_dropout", "mask", dropout_mask(d, e) * T * x.h, residual);
  r.mlp = true;
  mpt_norm(r, "norm_2", m, x, d, norm_weights, m.mlp == MlpKind::swiglu ? 2 : 1);
  activation_rows(r, "ffn", m, x, e, m.mlp == MlpKind::swiglu ? 2 : 0);
  if (m.residual_dropout)
    r.add("resid_ffn_dropout", "mask", dropout_mask(d, e) * T * x.h, residual);
}

// GPTNeoXLayer with the parallel residual: both LayerNorms read the block input (kept once). The
// fused query_key_value output stays whole (v is a view of it); rotary rebuilds q and k (kept by
// sdpa in the compute dtype); dense reads a contiguous copy of the attention output. The MLP
// keeps what its hidden_act keeps (mlp_inner_tensors).
void neox_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j, const Dtypes& d) {
  const double T = x.T, h = x.h, q = x.q, e = d.e;
  layernorm(r, "input_layernorm", x, d, 1, true);
  // Eager attention's matmul with v reads it as [b·a, s, d]: at b = 1 a view that keeps the whole
  // fused output alive, at b > 1 a copy of v alone.
  const bool copy = j.attention == AttentionImpl::eager && j.micro_batch > 1;
  r.add("attention", copy ? "v's copy" : "query_key_value's output", (copy ? 1 : 3) * e * T * q,
        heads);
  r.add("rotary", "rotated q and k", 2 * e * T * q, heads);
  if (j.attention == AttentionImpl::flash) {
    r.add("sdpa", "output", e * T * q, heads);
    r.add("sdpa", "kernel state", sdpa_kernel_state(x, d), heads);
  } else {
    eager_probabilities(r, m, x, d);
  }
  r.add("dense", "input (a contiguous copy)", e * T * h, heads);
  r.mlp = !m.parallel_residual;
  layernorm(r, "post_attention_layernorm", x, d, 1, !m.parallel_residual);
  activation_rows(r, "mlp", m, x, e);
  r.mlp = false;
  if (m.residual_dropout) {
    r.add("attention dropout", "mask", dropout_mask(d, e) * T * h, residual);
    r.add("mlp dropout", "mask", dropout_mask(d, e) * T * h, residual);
  }
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
// - A mixture of experts' grouped experts (moe_mlp_rows): as SwiGLU's, over the k·T routed rows
//   in the experts' dtype w, 2·w·kT·I; where a shared expert's output is added beside them, its
//   branch's incoming gradient [T, h] waits in the compute dtype. FSDP2's fp32 steps peak inside
//   mlp.experts (tests/costmodel/data/oracle_moe_steps.json): exact at 512 tokens a micro-batch,
//   up to 2.1% under at 256, where the measured moment holds more than this chain's (not
//   derived).
double mlp_backward_transient(const ModelSpec& m, const Shape& x, const Dtypes& d) {
  const double e = d.e;
  if (m.moe.experts > 0)
    return 2 * std::max(d.p, d.e) * static_cast<double>(m.moe.top_k) * x.T * x.I +
           (m.moe.shared_intermediate > 0 ? e * x.T * x.h : 0);
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

void architecture_rows(Rows& r, const ModelSpec& m, const Shape& x, const TrainingJob& j,
                       const Dtypes& d) {
  switch (m.architecture) {
  case Architecture::gpt2:
    return gpt2_rows(r, m, x, j, d);
  case Architecture::gpt_neox:
    return neox_rows(r, m, x, j, d);
  case Architecture::mpt:
    return mpt_rows(r, m, x, j, d);
  case Architecture::llama:
  case Architecture::mistral:
  case Architecture::qwen2:
  case Architecture::uniform:
    break;
  case Architecture::mixtral:
  case Architecture::qwen2_moe:
  case Architecture::qwen3_moe:
  case Architecture::olmoe:
    return moe_rows(r, m, x, j, d);
  }
  llama_rows(r, m, x, j, d);
}

double sum_rows(const BlockTable& b, const RankSplit& r, bool (*counted)(const SavedTensor&)) {
  double n = 0;
  for (const auto& row : b.saved)
    if (counted(row)) n += row.bytes / r.of(row.place);
  return n;
}

}  // namespace

// Whether transformers hands sdpa an explicit mask: masking_utils._ignore_causal_mask_sdpa keeps
// the mask of a sliding window once the keys reach the window's length (kv_length >= window);
// otherwise sdpa runs with is_causal and no mask.
bool sdpa_gets_mask(const ModelSpec& m, const TrainingJob& j) {
  return recipe_traits(j.recipe).transformers_code && j.attention == AttentionImpl::flash &&
         m.sliding_window > 0 && j.seq_len >= m.sliding_window;
}

BlockTable block_table(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const Shape x(m, j);
  BlockTable b;
  b.saved.reserve(32);  // the longest table's rows: one allocation per block
  Rows rows{b.saved};
  const auto& recipe = recipe_traits(j.recipe);
  if (!recipe.framework) {
    executor_rows(rows, m, j, x, f.e);
    b.input = f.e * x.T * x.h;
  } else if (recipe.saved == SavedTensors::korthikanti) {
    korthikanti_rows(rows, m, j, x, f.e);
    b.input = f.e * x.T * x.h;
  } else {
    const Dtypes d(f);
    architecture_rows(rows, m, x, j, d);
    b.input = d.r * x.T * x.h;  // torch.utils.checkpoint keeps the block's input
    b.mlp_backward = mlp_backward_transient(m, x, d);
  }
  return b;
}

double RankSplit::of(Placement p) const {
  switch (p) {
  case residual:
    return sp;
  case linear_input:
    return gathered_linear_inputs ? 1 : sp;
  case heads:
    return t;
  }
  return 1;
}

double rank_bytes(const BlockTable& b, const RankSplit& r) {
  return sum_rows(b, r, [](const SavedTensor&) { return true; });
}
double rank_core_bytes(const BlockTable& b, const RankSplit& r) {
  return sum_rows(b, r, [](const SavedTensor& s) { return s.core; });
}
double rank_mlp_bytes(const BlockTable& b, const RankSplit& r) {
  return sum_rows(b, r, [](const SavedTensor& s) { return s.mlp; });
}
double placement_bytes(const BlockTable& b, Placement p) {
  double n = 0;
  for (const auto& row : b.saved)
    if (row.place == p) n += row.bytes;
  return n;
}

ActivationBytes rank_block(const BlockTable& b, const ModelSpec& m, const TrainingJob& j,
                           const Forward& f, const RankSplit& r, bool checkpointed) {
  const double full = rank_bytes(b, r);
  ActivationBytes out;
  out.mlp_backward = b.mlp_backward / r.t;
  if (checkpointed) {
    out.saved = b.input / r.sp;
    out.recompute = full;  // one block's activations rebuilt at a time in backward
    out.mlp_released = rank_mlp_bytes(b, r);
  } else if (j.checkpointing == Checkpointing::selective_attention &&
             j.attention == AttentionImpl::eager) {
    out.saved = full - rank_core_bytes(b, r);
  } else if (j.checkpointing == Checkpointing::selective_op) {
    out.saved = selective_op_saved(m, j, f, r.t, r.sp);
    // In backward the rest is rebuilt beside what was kept: the block's full set at once.
    out.recompute = std::max(0.0, full - out.saved);
  } else {
    out.saved = full;
    out.mlp_released = rank_mlp_bytes(b, r);
  }
  return out;
}

NormParts final_norm_parts(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const Shape x(m, j);
  const Dtypes d(f);
  BlockTable b;
  b.saved.reserve(8);
  Rows rows{b.saved};
  switch (m.architecture) {
  case Architecture::gpt2:
  case Architecture::gpt_neox:
    layernorm(rows, "final norm", x, d, 1, true);
    break;
  case Architecture::mpt:  // norm_f; the tied unembedding or lm_head keeps its output
    mpt_norm(rows, "norm_f", m, x, d, elements_named(m.head, "norm_f."), 1);
    break;
  default:
    switch (recipe_traits(j.recipe).rmsnorm) {
    case RmsNormCode::fused:
      rows.add("final_layernorm", "input", f.e * x.T * x.h, residual);
      rows.add("output_layer", "input", f.e * x.T * x.h, linear_input);
      break;
    case RmsNormCode::torch:
      torch_rmsnorm(rows, "norm", x, d, 1);
      break;
    case RmsNormCode::upcast:
      rmsnorm(rows, "norm", x, d, 1, d.r);
      break;
    }
  }
  return {placement_bytes(b, residual), placement_bytes(b, linear_input)};
}

}  // namespace shardplan::costmodel
