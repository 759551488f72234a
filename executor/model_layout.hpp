// Where each tensor lives inside a unit's flat parameter buffer. A unit's parameters are one
// contiguous float buffer laid out in exactly the order of the cost model's UnitTensors (embedding
// unit, one block — every block has the same layout — and the head unit), so the sharding engine
// can all-gather and reduce-scatter a unit as one flat buffer and the cost model's per-unit counts
// are the executor's sizes. Matrices are row-major [rows = out features, cols = in features], the
// shape UnitTensors gives them.
//
// The layout finds each tensor by its Hugging Face name, so the one tensor list of the cost model
// decides the order; a fused query_key_value (GPT-2 c_attn, GPT-NeoX query_key_value) is taken as
// its q rows, then its k rows, then its v rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "documents/model.hpp"

namespace shardplan::executor {

inline constexpr std::int64_t kAbsent = -1;  // offset of a tensor the model does not have
// Pointer to an optional tensor (a bias) of a flat unit buffer, or nullptr.
template <class S> S* at(S* unit, std::int64_t offset) {
  return offset == kAbsent ? nullptr : unit + offset;
}

struct LinearOffsets {
  std::int64_t weight = kAbsent;  // [out, in]
  std::int64_t bias = kAbsent;    // [out], or kAbsent
  std::int64_t out = 0;
  std::int64_t in = 0;
};

struct NormOffsets {
  std::int64_t weight = kAbsent;  // [hidden]
  std::int64_t bias = kAbsent;    // [hidden] for LayerNorm, kAbsent for RMSNorm
};

struct EmbeddingLayout {
  std::int64_t tokens = kAbsent;     // [vocab, hidden]
  std::int64_t positions = kAbsent;  // [max_positions, hidden] for learned positions
  std::int64_t size = 0;             // elements of the unit
};

struct BlockLayout {
  NormOffsets norm1;      // before attention
  NormOffsets norm2;      // before the MLP
  LinearOffsets q, k, v;  // [heads·head_dim, hidden], [kv_heads·head_dim, hidden] × 2
  LinearOffsets o;        // [hidden, heads·head_dim]
  LinearOffsets up;       // [intermediate, hidden]  (GELU: c_fc / dense_h_to_4h; SwiGLU: up_proj)
  LinearOffsets gate;     // [intermediate, hidden]  SwiGLU only (gate_proj)
  LinearOffsets down;     // [hidden, intermediate]
  std::int64_t size = 0;
};

struct HeadLayout {
  NormOffsets norm;               // final norm
  std::int64_t output = kAbsent;  // [vocab, hidden]; kAbsent when tied to the token embedding
  std::int64_t size = 0;
};

enum class UnitKind { embedding, block, head };

// One tensor of a unit with its offset in the unit's flat buffer.
struct TensorSlot {
  documents::Tensor tensor;
  std::int64_t offset = 0;
};

class GptLayout {
public:
  // Throws core::InputError ("/architectures") for a spec the executor cannot run (a bare
  // parameter count) and std::invalid_argument when the tensor list and the dimensions disagree.
  explicit GptLayout(const documents::ModelSpec& spec);

  const documents::ModelSpec& spec() const { return spec_; }
  const EmbeddingLayout& embedding() const { return embedding_; }
  const BlockLayout& block() const { return block_; }
  const HeadLayout& head() const { return head_; }

  // Units in execution order: 0 the embedding, 1..layers the blocks, layers + 1 the head.
  std::int64_t unit_count() const { return spec_.layers + 2; }
  UnitKind unit_kind(std::int64_t unit) const;
  std::int64_t unit_size(UnitKind kind) const;
  std::int64_t unit_size_of(std::int64_t unit) const { return unit_size(unit_kind(unit)); }
  const std::vector<TensorSlot>& slots(UnitKind kind) const;

private:
  documents::ModelSpec spec_;
  EmbeddingLayout embedding_;
  BlockLayout block_;
  HeadLayout head_;
  std::vector<TensorSlot> embedding_slots_, block_slots_, head_slots_;
};

}  // namespace shardplan::executor
