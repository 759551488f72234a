// The layers that are not GEMMs: norms, residual adds, rotary positions, the MLP's activation,
// embedding lookups and the loss's log-softmax. Each is a pass over its width per token, forward
// and backward; a device runs them at an element-wise rate that is not its GEMM rate (a GPU's
// memory bandwidth; on a CPU, the loops and exp). calibrate times these same layers with the
// executor's kernels at the model's widths and divides by the passes counted here, so the rate it
// writes (calibration.elementwise_Gelems_per_s) and the time the cost model adds agree on what a
// pass is. Attention's core is not here: its FLOPs are counted with the GEMMs.
#pragma once

#include <vector>

#include "costmodel/document_names.hpp"

namespace shardplan::costmodel {

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

}  // namespace shardplan::costmodel
