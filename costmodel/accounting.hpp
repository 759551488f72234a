// Per-unit accounting: bytes of model state per parameter for a precision policy and flavour,
// optimizer-state elements, forward FLOPs, and activation bytes for a micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/job.hpp"
#include "costmodel/model.hpp"
#include "costmodel/sharding.hpp"

namespace shardplan::costmodel {

// `framework`: what the flavour really keeps (FACTS.md); `zero_paper`: Rajbhandari et al. 2020
// §3, 2 + 2 + K bytes per parameter with K = 12 (fp32 master 4, momentum 4, variance 4).
enum class Accounting { framework, zero_paper };

// Bytes per parameter element of each model state.
struct StateBytes {
  double param = 0;    // parameter storage at rest (the sharded part divided by the shard group)
  double grad = 0;     // gradient storage kept across micro-batches
  double master = 0;   // separate fp32 master copy (counted with optimizer states)
  double moment = 0;   // per optimizer-state element (see optimizer_state_elements)
  double compute = 0;  // gathered parameters and freshly computed gradients (compute dtype)
  double step_grad = 0;  // transient gradient copy the optimizer step makes (DeepSpeed fp32 cast)
};

StateBytes state_bytes(Precision p, const ShardingSpec& spec, Accounting a);

// Elements of optimizer state for a unit: Adam/AdamW 2 per parameter; SGD with momentum 1;
// Adafactor (Shazeer & Stern 2018, default beta1=None) a row and a column vector per matrix and
// one element per vector parameter.
std::int64_t optimizer_state_elements(const UnitTensors& u, Optimizer o);

// Elements of a unit that never get sharded: tensors below the persistence threshold (ZeRO-3's
// stage3_param_persistence_threshold).
std::int64_t persistent_elements(const UnitTensors& u, std::int64_t threshold);

// Forward FLOPs per token. Matmuls: 2 FLOPs per weight element and token; attention:
// 4·s·(heads·head_dim) per token for QKᵀ and attention×V (Narayanan et al. 2021, §5.1: 24Bsh² +
// 4Bs²h per layer, the second term over B·s tokens). Backward is 2× forward.
double block_forward_flops_per_token(const ModelSpec& m, std::int64_t seq_len);
double head_forward_flops_per_token(const ModelSpec& m);
// Of the block's forward FLOPs, the attention core that selective checkpointing recomputes.
double attention_core_flops_per_token(const ModelSpec& m, std::int64_t seq_len);

struct ActivationBytes {
  double saved = 0;      // kept from forward to backward, per unit
  double recompute = 0;  // extra alive while the unit's backward recomputes (full checkpointing)
  double backward = 0;   // transient during the unit's backward (e.g. the logits gradient)
};

// Korthikanti et al. 2022, Table 2, derived per tensor for this architecture rather than copied:
// with GPT-2's shapes (4h GELU MLP, dropout, MHA, LayerNorm) and 2-byte activations it gives the
// paper's s·b·h·(34 + 5·a·s/h) per layer; flash attention keeps the logsumexp (fp32, a·s·b)
// instead of the a·s²·b scores; selective drops the attention core; full keeps the block input.
ActivationBytes block_activations(const ModelSpec& m, std::int64_t seq_len, std::int64_t micro_batch,
                                  double bytes_per_element, AttentionImpl attention,
                                  Checkpointing ckpt);
// The head: final-norm and projection inputs, logits in the compute dtype, their fp32 upcast and
// the log-softmax the loss saves (HF *ForCausalLM casts logits to float before the loss; torch
// cross_entropy saves log_softmax); the fp32 logits gradient is the backward transient.
ActivationBytes head_activations(const ModelSpec& m, std::int64_t seq_len, std::int64_t micro_batch,
                                 double bytes_per_element);

}  // namespace shardplan::costmodel
