#include "costmodel/traffic.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/recipe.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace shardplan::costmodel {

using documents::Architecture;
using documents::LossImpl;
using documents::MlpKind;
using documents::ModelSpec;
using documents::NormKind;
using documents::PositionKind;
using documents::QkNorm;
using documents::recipe_traits;
using documents::RmsNormCode;
using documents::SavedTensors;
using documents::Tensor;
using documents::TrainingJob;
using documents::UnitKind;
using documents::UnitTensors;

namespace {

// Widths of one micro-batch as doubles, and the dtypes the recipe computes in: e bytes of the
// compute dtype, r bytes of the residual stream (the parameters' dtype: fp32 under autocast, the
// compute dtype where FSDP or DeepSpeed hand 16-bit parameters), 4 for fp32 intermediates.
struct TrafficShape {
  double T, s, h, q, kv, I, V, hd, e, r;
  bool autocast, cuda;
  TrafficShape(const ModelSpec& m, const TrainingJob& j, const Forward& f)
      : T(static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch)),
        s(static_cast<double>(j.seq_len)), h(static_cast<double>(m.hidden)),
        q(static_cast<double>(m.q_width())), kv(static_cast<double>(m.kv_width())),
        I(static_cast<double>(m.intermediate)), V(static_cast<double>(m.vocab)),
        hd(static_cast<double>(m.head_dim)), e(f.e), r(f.p), autocast(f.p > f.e), cuda(f.cuda) {}
  // A cast between the residual dtype and the compute dtype, per element (0 when they agree).
  double cast() const { return r > e ? r + e : 0; }
  // A cast of an fp32 intermediate to the compute dtype and back, per element.
  double fp32_cast() const { return e < 4 ? 4 + e : 0; }
};

// Bytes per token and the ops (kernels) that move them, per micro-batch.
Traffic per_token(const TrafficShape& x, double forward, double backward, double forward_ops,
                  double backward_ops) {
  return {x.T * forward, x.T * backward, forward_ops, backward_ops};
}

// The norms, per token, as each recipe's code runs them.
// transformers' LlamaRMSNorm (Llama, Mistral, Qwen2), eager ops in fp32: x.to(float32) (a copy
// when r < 4), pow(2) 8, mean 4, x·rsqrt 8, .to(r), weight·y 2r. Its backward, op by op: 92
// bytes per element in fp32 (the traced sequence: mul 8, mul 12, sum 4, mul 12, mul 8, sum 4,
// div 4, pow 8, mul 8, mul 12, add 12), plus the two casts when r < 4.
Traffic hf_rmsnorm(const TrafficShape& x) {
  const double casts = x.r < 4 ? 2 * (4 + x.r) : 0, cast_ops = x.r < 4 ? 2 : 0;
  return per_token(x, (20 + 2 * x.r + casts) * x.h, (92 + casts) * x.h, 6 + cast_ops,
                   14 + cast_ops);
}
// torch's nn.RMSNorm (torchtitan) calls F.rms_norm: on CUDA the fused kernel reads x and writes
// y (and an fp32 rstd per token) and its backward reads dy and x and writes dx; elsewhere it runs
// as the ops above with the weight multiply in fp32 (28 and 92 bytes, plus the casts).
Traffic torch_rmsnorm(const TrafficShape& x) {
  if (x.cuda) return per_token(x, 2 * x.r * x.h + 4, 3 * x.r * x.h + 4, 1, 1);
  // With r < 4 the forward casts x up and y down, the backward casts twice up and once down.
  const double casts = x.r < 4 ? 2 * (4 + x.r) : 0;
  return per_token(x, (28 + casts) * x.h, (92 + casts) * x.h, x.r < 4 ? 8 : 6, x.r < 4 ? 17 : 14);
}
// nn.LayerNorm is one kernel on both devices (native_layer_norm): reads x, writes y, mean and
// rstd; backward reads dy, x, mean and rstd and writes dx and the affine gradients.
Traffic layernorm(const TrafficShape& x) {
  return per_token(x, 2 * x.r * x.h + 8, 3 * x.r * x.h + 8, 1, 1);
}

Traffic norm(const ModelSpec& m, const TrainingJob& j, const TrafficShape& x) {
  if (m.norm == NormKind::layernorm) return layernorm(x);
  return recipe_traits(j.recipe).rmsnorm == RmsNormCode::torch ? torch_rmsnorm(x) : hf_rmsnorm(x);
}

// transformers' rotate_half rotary embedding on one tensor of `width` elements per token:
// q·cos (an fp32 product, cos and sin being fp32), the negated half, the concatenation, ·sin,
// their fp32 sum, cast back (GPT-NeoX casts after joining the unrotated part): 5e + 20 per
// element, and the fp32 cos and sin rows read. Backward: the two products 16, the negation, two
// slice gradients and two adds 10e, three casts.
Traffic rotate_half(const TrafficShape& x, double width, bool cast_back) {
  const double table = 2 * 4 * x.hd;  // cos and sin per token, read once per product
  const double casts = x.e < 4 ? 1 : 0, back = cast_back ? casts : 0;
  return per_token(x, (5 * x.e + 20 + back * (4 + x.e)) * width + table,
                   (16 + 10 * x.e + 3 * x.fp32_cast()) * width + table, 5 + back, 7 + 3 * casts);
}
// torchtitan's ComplexRoPE: the fp32 view of q or k (a cast when e < 4), one complex product
// with freqs_cis, cast back; the backward is the conjugate product.
Traffic complex_rope(const TrafficShape& x, double width) {
  const double table = 4 * x.hd;         // one complex64 row of hd/2 per token
  const double casts = x.e < 4 ? 2 : 0;  // per tensor: to fp32 and back
  return per_token(x, (8 + 2 * x.fp32_cast()) * width + table,
                   (8 + 2 * x.fp32_cast()) * width + 2 * table, 2 * (1 + casts), 2 * (1 + casts));
}

Traffic& operator+=(Traffic& a, const Traffic& b) {
  a.forward += b.forward;
  a.backward += b.backward;
  a.forward_ops += b.forward_ops;
  a.backward_ops += b.backward_ops;
  return a;
}
Traffic times(double n, Traffic t) {
  return {n * t.forward, n * t.backward, n * t.forward_ops, n * t.backward_ops};
}

// The GEMMs that read the attention norm's output and the MLP norm's output: under autocast each
// casts its own input; their input gradients are cast back and summed in the residual dtype.
struct Consumers {
  int attention = 1, mlp = 1;
};
Consumers consumers(const ModelSpec& m, const TrainingJob& j) {
  switch (m.architecture) {
  case Architecture::gpt2:
  case Architecture::gpt_neox:
    return {1, 1};  // fused c_attn / query_key_value, one fc
  default:          // q, k, v apart (torchtitan fuses wqkv); gate and up for SwiGLU
    return {recipe_traits(j.recipe).fused_qkv_complex_rope ? 1 : 3,
            m.mlp == MlpKind::swiglu ? 2 : 1};
  }
}

// transformers 5.23's sparse MLP on its grouped_mm path, op by op as ATen runs it
// (tests/costmodel/data/oracle_moe_traffic.json, validation/measure_moe_traffic.py; a gather
// reads its whole source, an index backward is new_zeros then an accumulating index_put). S = k·T
// routed rows in the experts' dtype w (the weights'), the router in fp32, routing weights of
// dtype g (Mixtral's fp32; elsewhere the router logits' dtype).
Traffic moe_router(const ModelSpec& m, const TrafficShape& x) {
  const double T = x.T, E = static_cast<double>(m.moe.experts),
               k = static_cast<double>(m.moe.top_k);
  // softmax, topk; backward: topk's new_zeros and scatter, softmax's backward.
  Traffic t{T * (2 * E * 4) + T * (E * 4 + k * 12),
            T * (k * 4 + E * 4) + T * (2 * E * 4 + k * 12) + T * 3 * E * 4, 2, 3};
  if (m.moe.normalize_top_k) {
    // sum, the clone autograd keeps of the in-place div's input, div_; backward: three divs, a
    // mul, a neg, a sum and the two uses' gradient sum.
    t += per_token(x, (k * 4 + 4) + 2 * k * 4 + (2 * k * 4 + 4),
                   3 * (2 * k * 4 + 4) + 3 * k * 4 + 2 * k * 4 + (k * 4 + 4) + (2 * k * 4 + 4), 3,
                   7);
  }
  if (x.e < 4) {
    // Under autocast the router's logits are cast to fp32 for the softmax, and (except in
    // Mixtral) the top-k weights back to the logits' dtype; backward casts their gradients.
    const bool weights_back = !m.moe.fp32_routing_weights;
    const double casts = E * (4 + x.e) + (weights_back ? k * (4 + x.e) : 0);
    const double ops = weights_back ? 2 : 1;
    t += per_token(x, casts, casts, ops, ops);
  }
  return t;
}

Traffic moe_experts(const ModelSpec& m, const TrafficShape& x, double w) {
  const double T = x.T, h = x.h, I = x.I, E = static_cast<double>(m.moe.experts);
  const double S = static_cast<double>(m.moe.top_k) * T;
  const double g = m.moe.fp32_routing_weights ? 4 : x.e;
  const double forward = 2 * S * 8 + 3 * S * 8                // perm // k, sort
                         + (T * h * x.r + S * 8 + S * h * w)  // the gather
                         + (2 * S * g + S * 8)                // the routing weights gathered
                         + (S * 8 + S * 4) + (S * 4 + E * 4) + 2 * E * 4  // ids, histc, cumsum
                         + 2 * S * I * w + 3 * S * I * w                  // silu, the product
                         + (2 * S * h * w + S * g)                     // times the routing weights
                         + S * 8 + 4 * S * 8                           // arange, index_put_
                         + (2 * S * h * w + S * 8)                     // the un-permute
                         + (S * h * w + T * h * w);                    // the sum over k
  const double backward = (T * h * w + S * h * w)                      // the sum's view
                          + (2 * S * h * w) + (3 * S * h * w + S * 8)  // un-permute's backward
                          + (2 * S * h * w + S * g) + 3 * S * h * w + (S * h * w + S * g) +
                          2 * S * g + (3 * S * g + S * 8)                      // routing weights
                          + 2 * 3 * S * I * w + 3 * S * I * w + 4 * S * I * w  // product, silu, cat
                          + (S * h * w + T * h * x.r) + (2 * T * h * x.r + S * 8 + S * h * w);
  return {forward, backward, 14, 14};  // the kernels each sum above names, each way
}

// Qwen2-MoE's shared expert (a SwiGLU of width S in the compute dtype) under its sigmoid gate,
// added to the experts' output.
Traffic moe_shared(const ModelSpec& m, const TrafficShape& x, double w) {
  if (m.moe.shared_intermediate == 0) return {};
  const double S = static_cast<double>(m.moe.shared_intermediate), e = x.e, h = x.h;
  return per_token(x, 2 * S * e + 3 * S * e + 2 * e + (e + 2 * h * e) + (2 * w + e) * h,
                   3 * h * e + (h * e + e) + (e + 2 * h * e) + 3 * e + 2 * 3 * S * e + 3 * S * e, 5,
                   7);
}

// transformers' GPT-2 writes gelu_new out in ops (NewGELUActivation: 0.5·x·(1 + tanh(√(2/π)·
// (x + 0.044715·x³)))): 8 element-wise ops forward, 11 backward. Other GELUs are one kernel.
bool written_out_gelu(const ModelSpec& m) {
  if (m.architecture != Architecture::gpt2) return false;
  const auto& c = m.hf_config;
  const auto it = c.is_object() ? c.find("activation_function") : c.end();
  return it == c.end() || (it->is_string() && it->get<std::string>() == "gelu_new");
}

Traffic activation(const ModelSpec& m, const TrafficShape& x) {
  if (m.mlp == MlpKind::swiglu)  // silu(gate) 2e, ·up 3e; backward: two products and silu's 9e
    return per_token(x, 5 * x.e * x.I, 9 * x.e * x.I, 2, 3);
  if (written_out_gelu(m)) return per_token(x, 18 * x.e * x.I, 28 * x.e * x.I, 8, 11);
  return per_token(x, 2 * x.e * x.I, 3 * x.e * x.I, 1, 1);
}

// The rotary embedding, the copies the attention's inputs and gradients take.
Traffic attention_copies(const ModelSpec& m, const TrainingJob& j, const TrafficShape& x) {
  Traffic t;
  switch (m.architecture) {
  case Architecture::gpt2:
    t.backward = x.T * 2 * x.e * 3 * x.h;  // the q, k, v gradients concatenated for c_attn
    t.backward_ops = 1;
    break;
  case Architecture::gpt_neox: {
    // rotary_pct of each head is rotated; the rotated and the passed parts are concatenated
    // (in fp32, the rotation's dtype) and cast back; v is made contiguous; the backward
    // splits the gradients by slices and concatenates q, k and v's for query_key_value.
    const double rotated = x.q * static_cast<double>(m.rotary_dim) / x.hd;
    t += times(2, rotate_half(x, rotated, false));
    t.forward +=
        x.T *
        (2 * 8 * x.q + (x.e < 4 ? 2 * (x.fp32_cast() * (x.q - rotated) + x.fp32_cast() * x.q) : 0) +
         2 * x.e * x.q);
    t.backward += x.T * (2 * 6 * x.e * x.q + 2 * 2 * x.e * 3 * x.q);
    // Forward: two concatenations (and with e < 4 four casts: the passed parts up, q and k
    // down) and v's copy; backward: two slice gradients and an add per tensor, the concatenation
    // and its copy.
    t.forward_ops += 3 + (x.e < 4 ? 4 : 0);
    t.backward_ops += 2 * 3 + 2;
    break;
  }
  default:
    if (recipe_traits(j.recipe).fused_qkv_complex_rope) {
      // wqkv's output split into contiguous q, k, v; their gradients concatenated back.
      t.forward = t.backward = x.T * 2 * x.e * (x.q + 2 * x.kv);
      t.forward_ops = 3;  // three copies; one concatenation back
      t.backward_ops = 1;
      t += complex_rope(x, x.q + x.kv);
    } else {
      t += times(2, rotate_half(x, (x.q + x.kv) / 2, true));  // q and k
      t.backward += x.T * 2 * x.e * (x.q + x.kv);  // q's and k's gradients made contiguous
      t.backward_ops += 2;
    }
  }
  return t;
}

// Σ elements of the unit's matrices: autocast casts each weight to the compute dtype in forward
// and each weight gradient back in backward.
double weight_casts(const TrafficShape& x, double matrix_elements) {
  return x.autocast ? x.cast() * matrix_elements : 0;
}

// The unit's linear layers' bias vectors (P.bias beside a matrix P.weight; a norm's bias is the
// norm's): their elements and how many.
struct Biases {
  double elements = 0, tensors = 0;
};
Biases biases(const UnitTensors& u) {
  Biases b;
  const std::string suffix = ".bias";
  for (const auto& t : u.tensors) {
    if (t.is_matrix() || t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string weight = t.name.substr(0, t.name.size() - suffix.size()) + ".weight";
    const bool linear = std::any_of(u.tensors.begin(), u.tensors.end(), [&](const Tensor& w) {
      return w.is_matrix() && w.name == weight;
    });
    if (!linear) continue;
    b.elements += static_cast<double>(t.elements());
    b.tensors += 1;
  }
  return b;
}

// torchtitan's block compiled (j.compile: its apply_compile; costmodel/block_table.cpp,
// compiled_llama_rows). Forward: the bytes of Inductor's fused kernels as its scheduler counts
// them (tests/costmodel/data/oracle_compile_units.json, generated kernels per token, over two
// head groupings and two dtypes): reads e·(6h + q + 2kv + 2I) and the norms' weights, writes
// e·(3h + q + 2kv + I) and the two fp32 rstd, in 7 kernels (the norms with their multiplies, the q
// and k splits into RoPE's layout, v's copy, the residual adds, SiLU with the product), and with a
// 16-bit compute dtype RoPE's round trip through fp32, 4·(q + kv) each way; plus ComplexRoPE's
// complex products, which Inductor leaves to ATen (it generates no complex code), 8 bytes per
// complex64 element of q and k each way and freqs_cis's row (4·hd bytes) per position and product.
// Backward: the eager block's (the compiled backward graph's kernels are not derived; this leaves
// the step's time an upper bound).
Traffic compiled_block_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f,
                               Traffic eager) {
  const TrafficShape x(m, j, f);
  const double rope_fp32 = x.e < 4 ? 4 * (x.q + x.kv) : 0;
  const double generated = x.e * (6 * x.h + x.q + 2 * x.kv + 2 * x.I) + rope_fp32 +
                           x.e * (3 * x.h + x.q + 2 * x.kv + x.I) + 8 + rope_fp32;
  const double rope = 2 * 4 * (x.q + x.kv);
  const double rope_table = 2 * 4 * x.hd * x.s;  // each product's rows, one per position
  const double norm_weights = 2 * x.r * x.h;     // read once per call
  eager.forward = x.T * (generated + rope) + rope_table + norm_weights;
  eager.forward_ops = 7 + 2;
  return eager;
}

// A framework's block, op by op.
std::vector<UnitOp> recipe_block_ops(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const TrafficShape x(m, j, f);
  const Traffic normed = norm(m, j, x);
  // A residual add: r + the branch's output (e) + r forward; the gradient sums in backward.
  const Traffic add = per_token(x, (2 * x.r + x.e) * x.h, 3 * x.r * x.h, 1, 1);
  const Consumers c = consumers(m, j);
  const bool moe = m.moe.experts > 0;
  // The GEMMs that cast the norms' outputs under autocast; a mixture of experts' gather reads the
  // MLP norm's as well, uncast (grouped_mm runs in the weights' dtype), its input gradient summed
  // with theirs.
  const double casting = c.attention + (moe ? m.moe.input_gemms() : c.mlp);
  const double readers = casting + (moe ? 1 : 0);
  const Biases b = biases(m.block);
  std::vector<UnitOp> ops;
  ops.reserve(11);
  ops.push_back({"attention norm", normed, OpSpread::residual});
  ops.push_back({"mlp norm", normed, OpSpread::residual});
  ops.push_back({"attention inputs (rotary, copies)", attention_copies(m, j, x)});
  if (m.qk_norm != QkNorm::none && recipe_traits(j.recipe).transformers_code) {
    // Qwen3-MoE's and OLMoE's norms on q and k: transformers' upcast RMSNorm over the projections'
    // outputs, which are in the compute dtype.
    TrafficShape qk = x;
    qk.h = x.q + x.kv;
    qk.r = x.e;
    Traffic norms = hf_rmsnorm(qk);  // the bytes of q's and k's elements, the kernels twice
    norms.forward_ops *= 2;
    norms.backward_ops *= 2;
    ops.push_back({"q and k norms", norms, OpSpread::heads});
  }
  if (moe) {
    const double w = std::max(f.p, f.e);  // the experts' dtype: their weights'
    ops.push_back({"router", moe_router(m, x)});
    ops.push_back({"experts' dispatch, activation and combine", moe_experts(m, x, w)});
    ops.push_back({"shared expert", moe_shared(m, x, w)});
  } else {
    ops.push_back({"mlp activation", activation(m, x)});
  }
  // The attention's add and the MLP's; the parallel residual adds both branches at the end.
  ops.push_back({"attention residual add", add, OpSpread::residual, m.parallel_residual});
  ops.push_back({"mlp residual add", add, OpSpread::residual, true});
  if (x.autocast) {
    // Each reader casts the fp32 norm output; its input gradient is cast back; the branch
    // outputs' gradients are cast to the compute dtype for o_proj and down_proj. Each weight
    // and bias is cast in forward and its gradient cast back. (Counted with the rank's heads
    // under tensor parallelism.)
    double params = b.tensors;  // the cast weights (not a fused experts tensor) and biases
    for (const auto& t : m.block.tensors) params += t.is_matrix() && t.experts == 1 ? 1 : 0;
    ops.push_back(
        {"autocast casts", per_token(x, casting * x.cast() * x.h, (casting + 2) * x.cast() * x.h,
                                     casting + params, casting + 2 + params)});
  }
  // The input gradients of several readers of one tensor are summed; the bias gradients are sums
  // over the tokens.
  ops.push_back({"input gradient sums", {0, x.T * (readers - 2) * 3 * x.r * x.h, 0, readers - 2}});
  ops.push_back({"bias gradients", {0, x.T * x.e * b.elements, 0, b.tensors}});
  const double w = weight_casts(x, static_cast<double>(m.block.matmul_params()));
  ops.push_back({"weight casts", {w, w, 0, 0}});
  return ops;
}

// A framework's head, op by op: its final norm, the projection's autocast casts and the loss.
std::vector<UnitOp> recipe_head_ops(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const TrafficShape x(m, j, f);
  std::vector<UnitOp> ops = {{"final norm", norm(m, j, x), OpSpread::residual}};
  if (x.autocast) {  // the projection's input, its gradient, its weight and weight gradient
    Traffic casts = per_token(x, x.cast() * x.h, x.cast() * x.h, 2, 2);
    casts.forward += x.cast() * x.V * x.h;
    casts.backward += x.cast() * x.V * x.h;
    ops.push_back({"projection casts", casts, OpSpread::vocabulary});
  }
  Traffic t;
  if (j.loss == LossImpl::upcast || j.loss == LossImpl::chunked) {
    // logits.float() (a copy when e < 4), log_softmax reads and writes [T, V] in fp32, the
    // negative log-likelihood indexes it; backward: nll's gradient written in full, log_softmax's
    // backward reads it and the output and writes the logits' gradient, cast to e. torchtitan's
    // ChunkedLossWrapper runs the same ops chunk by chunk.
    // Ops: the upcast, log_softmax, nll and the labels' shift (transformers) or the division by
    // the token count (torchtitan); backward: the loss's seed, nll's and log_softmax's
    // backward, the division's, the cast back.
    // transformers' shifted labels are a copy when the micro-batch has more than one sequence.
    const double upcast = x.e < 4 ? 1 : 0;
    const bool transformers = recipe_traits(j.recipe).transformers_code;
    const double shift_copy = transformers && j.micro_batch > 1 ? 1 : 0;
    const double divide = transformers ? 0 : 1;
    t += per_token(x, (x.fp32_cast() + 8) * x.V, (16 + x.fp32_cast()) * x.V,
                   upcast + 3 + shift_copy, 3 + divide + upcast);
  } else {
    // A fused loss (flash-attn's or a compiled cross-entropy, Liger's fused linear one, Megatron's
    // in place) reads the logits for the log-sum-exp, then reads them again and writes their
    // gradient: 3e per element of [T, V], without fp32 copies.
    t += per_token(x, x.e * x.V, 2 * x.e * x.V, 1, 1);
  }
  ops.push_back({"loss", t, OpSpread::vocabulary});
  return ops;
}

// A framework's embeddings: the lookups, their gradients and the model's per-position work.
Traffic recipe_embedding_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const TrafficShape x(m, j, f);
  if (m.embedding.tensors.empty()) return {};
  // A lookup reads its rows and writes them (and the ids); its dense backward reads the rows'
  // gradient and writes the whole table's gradient (embedding_dense_backward), in the parameter
  // dtype; a tied table adds the head's gradient into it. Per-position work (the learned position
  // rows, the rotary tables) runs over one sequence: position ids are [1, s], broadcast over the
  // micro-batch.
  Traffic t = per_token(x, 2 * x.r * x.h + 8, x.r * x.h + 8, 1, 1);
  t.backward += x.r * x.V * x.h;
  if (m.tied_embeddings) t.backward += 3 * x.r * x.V * x.h;
  if (m.positions == PositionKind::learned) {
    t.forward += x.s * (2 * x.r * x.h + 8) + (2 * x.T + x.s) * x.r * x.h;  // rows, then their sum
    t.backward += x.s * (x.r * x.h + 8) + x.r * static_cast<double>(m.max_positions) * x.h;
    t.forward_ops += 2;  // the position lookup and the sum
    t.backward_ops += 1;
  }
  if (recipe_traits(j.recipe).transformers_code) {
    // transformers' model forward: position ids and the causal mask's int64 ops (arange, add,
    // cat, sub, ne, cumsum: about 80 bytes per position) and, with rotary positions, the fp32
    // cos and sin rows (inv_freq·position, cat, cos, sin and their scaling: six passes read and
    // written over the rotary width, 48 bytes per element).
    t.forward += x.s * 80;
    t.forward_ops += 9;  // the position ids' and mask's ops
    if (m.positions == PositionKind::rotary) {
      t.forward += x.s * 48 * static_cast<double>(m.rotary_dim);
      t.forward_ops += 7;
    }
  }
  return t;
}

// The executor's and Megatron-core's fused kernels: each element-wise layer's passes
// (documents/workload.hpp) over the micro-batch's tokens in the compute dtype, one kernel each
// way per layer.
std::vector<UnitOp> kernel_ops(const std::vector<documents::ElementwiseOp>& layers,
                               const TrainingJob& j) {
  using documents::ElementwiseKind;
  const double T = static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch);
  const double e = documents::dtype_bytes(documents::compute_dtype(j.precision));
  std::vector<UnitOp> ops;
  for (const auto& l : layers) {
    const documents::Passes p = documents::passes_of(l.kind);
    const double elements = T * l.width * l.count;
    const bool residual =
        l.kind == ElementwiseKind::layernorm || l.kind == ElementwiseKind::rmsnorm ||
        l.kind == ElementwiseKind::residual || l.kind == ElementwiseKind::embedding;
    ops.push_back({documents::elementwise_kind_name(l.kind),
                   {elements * p.forward * e, elements * p.backward * e, l.count, l.count},
                   residual                                 ? OpSpread::residual
                   : l.kind == ElementwiseKind::log_softmax ? OpSpread::vocabulary
                                                            : OpSpread::heads});
  }
  return ops;
}

}  // namespace

std::vector<UnitOp> unit_ops(const ModelSpec& m, const TrainingJob& j, const Forward& f,
                             UnitKind unit) {
  if (recipe_traits(j.recipe).saved == SavedTensors::korthikanti) {
    return kernel_ops(unit == UnitKind::block  ? documents::block_elementwise_ops(m)
                      : unit == UnitKind::head ? documents::head_elementwise_ops(m)
                                               : documents::embedding_elementwise_ops(m),
                      j);
  }
  if (unit == UnitKind::block) return recipe_block_ops(m, j, f);
  if (unit == UnitKind::head) return recipe_head_ops(m, j, f);
  return {{"embeddings", recipe_embedding_traffic(m, j, f), OpSpread::residual}};
}

Traffic unit_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f, UnitKind unit,
                     OpSpread spread) {
  Traffic t;
  for (const auto& op : unit_ops(m, j, f, unit))
    if (op.spread == spread) t += op.moved;
  return t;
}

Traffic unit_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f, UnitKind unit) {
  Traffic t;
  for (const auto& op : unit_ops(m, j, f, unit)) t += op.moved;
  return unit == UnitKind::block && j.compile ? compiled_block_traffic(m, j, f, t) : t;
}

Traffic block_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  return unit_traffic(m, j, f, UnitKind::block);
}
Traffic head_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  return unit_traffic(m, j, f, UnitKind::head);
}
Traffic embedding_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  return unit_traffic(m, j, f, UnitKind::embedding);
}

Traffic recompute_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f) {
  const Traffic block = block_traffic(m, j, f);
  Traffic rerun{block.forward, 0, block.forward_ops, 0};
  // torch.utils.checkpoint stops the rerun once the last tensor backward needs is rebuilt
  // (early stop, its default): the ops that close the block are not rerun. torchtitan wraps its
  // blocks with early_stop=False (torchtitan/distributed/activation_checkpoint.py).
  if (recipe_traits(j.recipe).checkpoint_early_stop) {
    for (const auto& op : unit_ops(m, j, f, UnitKind::block)) {
      if (!op.closes) continue;
      rerun.forward -= op.moved.forward;
      rerun.forward_ops -= op.moved.forward_ops;
    }
  }
  return rerun;
}

}  // namespace shardplan::costmodel
