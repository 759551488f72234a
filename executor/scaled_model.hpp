// A smaller copy of a model for a small machine: the same architecture (norm, MLP, positions,
// biases, tied head, residual kind, dropout flags) with fewer blocks and smaller dimensions. The
// tensor lists are re-derived by the cost model's own config reader (a Hugging Face config.json
// with the new sizes is built and read), so the scaled model's units are exactly what the cost
// model would count for it.
#pragma once

#include <cstdint>

#include "documents/model.hpp"

namespace shardplan::executor {

struct ScaledSize {
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;      // 0: as many as heads (no GQA), or heads / (the source's ratio)
  std::int64_t head_dim = 0;      // 0: hidden / heads. Only Llama-family configs may set another
  std::int64_t intermediate = 0;  // 0: the source's intermediate / hidden ratio
  std::int64_t vocab = 0;
  std::int64_t max_positions = 0;  // 0: the source's (size of GPT-2's learned position table)
};

// Throws core::InputError ("--scale: ...") when the source is a bare parameter count or the
// new sizes are inconsistent (heads not dividing hidden, kv_heads not dividing heads, a GQA or
// head_dim the architecture cannot express).
documents::ModelSpec scale_down(const documents::ModelSpec& source, const ScaledSize& size);

}  // namespace shardplan::executor
