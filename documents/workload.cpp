#include "documents/workload.hpp"

namespace shardplan::documents {

namespace {

// Per kind, in ElementwiseKind order: its name and its passes (elementwise.hpp says why).
struct KindTraits {
  const char* name;
  Passes passes;
};
constexpr KindTraits kTraits[kElementwiseKinds] = {
    {"layernorm", {2, 4}}, {"rmsnorm", {2, 4}}, {"residual", {2, 3}},  {"rotary", {2, 2}},
    {"gelu", {2, 4}},      {"swiglu", {3, 7}},  {"embedding", {2, 3}}, {"log_softmax", {2, 3}}};

const KindTraits& traits(ElementwiseKind k) { return kTraits[static_cast<int>(k)]; }

ElementwiseKind norm_kind(const ModelSpec& m) {
  return m.norm == NormKind::layernorm ? ElementwiseKind::layernorm : ElementwiseKind::rmsnorm;
}

}  // namespace

const char* elementwise_kind_name(ElementwiseKind k) { return traits(k).name; }

Passes passes_of(ElementwiseKind k) { return traits(k).passes; }

std::vector<ElementwiseOp> block_elementwise_ops(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden);
  const bool swiglu = m.mlp == MlpKind::swiglu;
  std::vector<ElementwiseOp> ops = {
      {norm_kind(m), h, 2},
      // Sequential: two residual adds; GPT-NeoX's parallel residual adds both branches to x once
      // (the executor accumulates the second branch inside its GEMM).
      {ElementwiseKind::residual, h, m.parallel_residual ? 1.0 : 2.0},
      {swiglu ? ElementwiseKind::swiglu : ElementwiseKind::gelu,
       static_cast<double>(m.intermediate), 1}};
  if (m.positions == PositionKind::rotary)
    ops.push_back({ElementwiseKind::rotary, static_cast<double>(m.q_width() + m.kv_width()), 1});
  return ops;
}

std::vector<ElementwiseOp> head_elementwise_ops(const ModelSpec& m) {
  return {{norm_kind(m), static_cast<double>(m.hidden), 1},
          {ElementwiseKind::log_softmax, static_cast<double>(m.vocab), 1}};
}

std::vector<ElementwiseOp> embedding_elementwise_ops(const ModelSpec& m) {
  if (m.embedding.tensors.empty())  // a bare parameter count has no embeddings
    return {};
  return {{ElementwiseKind::embedding, static_cast<double>(m.hidden),
           m.positions == PositionKind::learned ? 2.0 : 1.0}};
}

Passes passes_per_token(const std::vector<ElementwiseOp>& ops) {
  Passes total;
  for (const auto& op : ops) {
    const Passes p = passes_of(op.kind);
    total.forward += op.count * op.width * p.forward;
    total.backward += op.count * op.width * p.backward;
  }
  return total;
}

std::vector<Gemm> forward_gemms(const ModelSpec& m, UnitKind unit, std::int64_t tokens) {
  std::vector<Gemm> gemms;
  if (unit == UnitKind::block) {
    for (const auto& t : m.block.tensors)
      if (t.is_matrix()) gemms.push_back({tokens, t.rows, t.cols, 1});
  } else if (unit == UnitKind::head) {
    // The head's projection: its own matrix, or the embedding matrix it is tied to.
    for (const auto& t : m.tied_embeddings ? m.embedding.tensors : m.head.tensors)
      if (t.is_matrix()) {
        gemms.push_back({tokens, t.rows, t.cols, 1});
        break;
      }
  }
  return gemms;
}

std::array<Gemm, 2> backward_gemms(const Gemm& f) {
  // y[T, out] = x[T, in]·Wᵀ: dx[T, in] = dy·W (k = out); dW[out, in] = dyᵀ·x (k = T).
  return {Gemm{f.m, f.k, f.n, f.count}, Gemm{f.n, f.k, f.m, f.count}};
}

double AttentionShape::scored_pairs() const {
  const auto s = static_cast<double>(seq) * static_cast<double>(context);
  return static_cast<double>(batch) * static_cast<double>(heads) * s * (s + 1) / 2 /
         static_cast<double>(context);
}

AttentionShape attention_shape(const ModelSpec& m, const TrainingJob& j, int context) {
  return {j.micro_batch, j.seq_len, m.heads, m.kv_heads, m.head_dim, context};
}

}  // namespace shardplan::documents
