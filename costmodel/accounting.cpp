#include "costmodel/accounting.hpp"

namespace shardplan::costmodel {

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
  const bool mixed = p == Precision::bf16_mixed || p == Precision::fp16_mixed;
  const double low = dtype_bytes(compute_dtype(p));  // 2 for bf16/fp16, 4 for fp32 (tf32)
  b.compute = low;
  b.moment = p == Precision::bf16 ? 2 : 4;
  if (!mixed) {  // fp32 or pure bf16: one copy of everything in one dtype
    b.param = b.grad = low;
    return b;
  }
  if (spec.separate_fp32_master) {
    // DeepSpeed: bf16/fp16 parameter partition + fp32 master partition; gradients accumulate in
    // the low-precision partition and the optimizer step casts a partition to fp32.
    b.param = low;
    b.grad = low;
    b.master = 4;
    b.step_grad = 4;
  } else {
    // PyTorch DDP under autocast and FSDP MixedPrecision: parameters (sharded or not) stay fp32
    // and are themselves the master copy; gradients end in fp32.
    b.param = 4;
    b.grad = 4;
  }
  return b;
}

std::int64_t optimizer_state_elements(const UnitTensors& u, Optimizer o) {
  switch (o) {
    case Optimizer::adam:
    case Optimizer::adamw: return 2 * u.params();
    case Optimizer::sgd: return u.params();
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

double block_forward_flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  return 2.0 * static_cast<double>(m.block.matmul_params()) + attention_core_flops_per_token(m, seq_len);
}

double attention_core_flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  return 4.0 * static_cast<double>(seq_len) * static_cast<double>(m.q_width());
}

double head_forward_flops_per_token(const ModelSpec& m) {
  return 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);
}

ActivationBytes block_activations(const ModelSpec& m, std::int64_t seq_len, std::int64_t micro_batch,
                                  double e, AttentionImpl attention, Checkpointing ckpt) {
  const double s = static_cast<double>(seq_len);
  const double T = s * static_cast<double>(micro_batch);  // tokens in the micro-batch
  const double h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.q_width());
  const double kv = static_cast<double>(m.kv_width());
  const double a = static_cast<double>(m.heads);
  const double I = static_cast<double>(m.intermediate);

  // Inputs of the two norms (one shared input with GPT-NeoX's parallel residual).
  const double norms = (m.parallel_residual ? 1.0 : 2.0) * e * T * h;
  // QKV projection input, Q, K, V kept for the core, output projection input.
  double attention_outer = e * T * h + e * T * (q + 2 * kv) + e * T * q;
  // The attention core: softmax output (and dropout mask + output) per head, s×s per sequence.
  double core = 0;
  if (attention == AttentionImpl::eager) {
    core = e * a * s * T;
    if (m.attention_dropout) core += (1.0 + e) * a * s * T;
  } else {
    core = 4.0 * a * T;  // fp32 logsumexp per head and token (FlashAttention-2's saved stats)
  }
  if (m.residual_dropout) attention_outer += T * h;  // 1-byte mask after the attention output
  double mlp = 0;
  if (m.mlp == MlpKind::gelu) {
    mlp = e * T * h + 2 * e * T * I;  // fc1 input; GELU input; fc2 input
  } else {
    mlp = e * T * h + 3 * e * T * I;  // gate/up input; gate out; up out; down input
  }
  if (m.residual_dropout) mlp += T * h;
  const double full = norms + attention_outer + core + mlp;
  ActivationBytes out;
  switch (ckpt) {
    case Checkpointing::none: out.saved = full; break;
    case Checkpointing::selective:  // the eager core is recomputed; flash keeps its statistics
      out.saved = norms + attention_outer + mlp + (attention == AttentionImpl::flash ? core : 0);
      break;
    case Checkpointing::full:
      out.saved = e * T * h;  // the block input only
      out.recompute = full;   // one block's activations rebuilt at a time in backward
      break;
  }
  return out;
}

ActivationBytes head_activations(const ModelSpec& m, std::int64_t seq_len, std::int64_t micro_batch,
                                 double e) {
  const double T = static_cast<double>(seq_len) * static_cast<double>(micro_batch);
  const double h = static_cast<double>(m.hidden);
  const double V = static_cast<double>(m.vocab);
  ActivationBytes out;
  out.saved = 2 * e * T * h + (e + 4 + 4) * T * V;
  out.backward = 4 * T * V;
  return out;
}

}  // namespace shardplan::costmodel
