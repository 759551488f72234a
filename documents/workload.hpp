// The work of one training step of a model, whatever runs it: the GEMMs of each unit, the
// attention core's shape and the layers that are not GEMMs. calibrate times exactly these shapes
// and layers on the user's device and the cost model (costmodel/compute_time.hpp) times a step
// from them, so the two agree on what was measured.
//
// A unit (the embeddings, one block, the head) runs per micro-batch:
//   forward:  its linear layers' GEMMs y = x·Wᵀ (m = tokens, n = out, k = in), the attention core,
//             and its element-wise layers;
//   backward: each GEMM's two transposes, dx = dy·W (m = tokens, n = in, k = out) and
//             dW = dyᵀ·x (m = out, n = in, k = tokens), the attention core's backward, and the
//             element-wise layers' backward passes.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "documents/job.hpp"
#include "documents/model.hpp"

namespace shardplan::documents {

// C[m, n] = A[m, k]·B[k, n], `count` times.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0;
  double count = 1;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * count;
  }
};

// The forward GEMMs of a unit's linear layers over `tokens` tokens: a block's matrices, the
// head's projection (or the embedding matrix it is tied to); none for the embeddings (a lookup).
enum class UnitKind { embedding, block, head };
std::vector<Gemm> forward_gemms(const ModelSpec& m, UnitKind unit, std::int64_t tokens);
// A forward GEMM's two backward GEMMs (input and weight gradients).
std::array<Gemm, 2> backward_gemms(const Gemm& forward);

// The causal attention core of one micro-batch.
struct AttentionShape {
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // Ranks sharing each sequence (ring attention): this rank's seq queries meet all S = seq·context
  // keys, and load-balanced chunks give every rank the same share of the causal triangle.
  std::int64_t context = 1;
  // Query-key pairs scored: the causal triangle with its diagonal, b·a·S·(S+1)/2, over the
  // context ranks.
  double scored_pairs() const;
};
AttentionShape attention_shape(const ModelSpec& m, const TrainingJob& j, int context = 1);

// The layers that are not GEMMs: norms, residual adds, rotary positions, the MLP's activation,
// embedding lookups and the loss's log-softmax. Each is a pass over its width per token, forward
// and backward; a device runs them at an element-wise rate that is not its GEMM rate (a GPU's
// memory bandwidth; on a CPU, the loops and exp). calibrate times these same layers with the
// executor's kernels at the model's widths and divides by the passes counted here, so the rate it
// writes (calibration.elementwise_Gelems_per_s) and the time the cost model adds agree on what a
// pass is. Attention's core is not here: its FLOPs are counted with the GEMMs.

enum class ElementwiseKind {
  layernorm,
  rmsnorm,
  residual,
  rotary,
  gelu,
  swiglu,
  embedding,
  log_softmax
};
constexpr int kElementwiseKinds = 8;
const char* elementwise_kind_name(ElementwiseKind k);

// Elements read plus elements written per element of the layer's width, from each kernel's
// arguments (kernels/kernels.hpp): a norm reads x and writes y (2) and in backward reads dy and
// x and adds into dx (4); a residual copies the stream (2) and adds its gradient (3); rotary
// rotates q and k in place (2, 2); GELU reads its input and writes (2), backward reads input,
// dout and dx and writes dx (4); SwiGLU reads gate and up and writes (3), backward reads dout,
// gate, up, dgate, dup and writes both (7); an embedding row is read and written (2), its
// gradient added into the table (3); log-softmax reads logits and writes log-probabilities (2),
// its backward reads both gradients' inputs and writes the logits' gradient (3).
struct Passes {
  double forward = 0, backward = 0;
};
Passes passes_of(ElementwiseKind k);

struct ElementwiseOp {
  ElementwiseKind kind;
  double width = 0;  // elements per token
  double count = 1;  // times per unit (per block, or once for the head)
};

// The ops of one block, of the head (final norm, log-softmax over the vocabulary) and of the
// embeddings (token and learned position rows).
std::vector<ElementwiseOp> block_elementwise_ops(const ModelSpec& m);
std::vector<ElementwiseOp> head_elementwise_ops(const ModelSpec& m);
std::vector<ElementwiseOp> embedding_elementwise_ops(const ModelSpec& m);

// Σ count · width · passes, per token.
Passes passes_per_token(const std::vector<ElementwiseOp>& ops);

}  // namespace shardplan::documents
