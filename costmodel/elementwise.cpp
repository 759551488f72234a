#include "costmodel/elementwise.hpp"

namespace shardplan::costmodel {

const char* elementwise_kind_name(ElementwiseKind k) {
  switch (k) {
    case ElementwiseKind::layernorm: return "layernorm";
    case ElementwiseKind::rmsnorm: return "rmsnorm";
    case ElementwiseKind::residual: return "residual";
    case ElementwiseKind::rotary: return "rotary";
    case ElementwiseKind::gelu: return "gelu";
    case ElementwiseKind::swiglu: return "swiglu";
    case ElementwiseKind::embedding: return "embedding";
    case ElementwiseKind::log_softmax: return "log_softmax";
  }
  return "?";
}

Passes passes_of(ElementwiseKind k) {
  switch (k) {
    case ElementwiseKind::layernorm:
    case ElementwiseKind::rmsnorm: return {2, 4};
    case ElementwiseKind::residual: return {2, 3};
    case ElementwiseKind::rotary: return {2, 2};
    case ElementwiseKind::gelu: return {2, 4};
    case ElementwiseKind::swiglu: return {3, 7};
    case ElementwiseKind::embedding: return {2, 3};
    case ElementwiseKind::log_softmax: return {2, 3};
  }
  return {};
}

namespace {

ElementwiseKind norm_kind(const ModelSpec& m) {
  return m.norm == NormKind::layernorm ? ElementwiseKind::layernorm : ElementwiseKind::rmsnorm;
}

} // namespace

std::vector<ElementwiseOp> block_elementwise_ops(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden);
  const bool swiglu = m.mlp == MlpKind::swiglu;
  std::vector<ElementwiseOp> ops = {
      {norm_kind(m), h, 2},
      // Sequential: two residual adds; GPT-NeoX's parallel residual adds both branches to x once
      // (the executor accumulates the second branch inside its GEMM).
      {ElementwiseKind::residual, h, m.parallel_residual ? 1.0 : 2.0},
      {swiglu ? ElementwiseKind::swiglu : ElementwiseKind::gelu, static_cast<double>(m.intermediate),
       1}};
  if (m.positions == PositionKind::rotary)
    ops.push_back({ElementwiseKind::rotary, static_cast<double>(m.q_width() + m.kv_width()), 1});
  return ops;
}

std::vector<ElementwiseOp> head_elementwise_ops(const ModelSpec& m) {
  return {{norm_kind(m), static_cast<double>(m.hidden), 1},
          {ElementwiseKind::log_softmax, static_cast<double>(m.vocab), 1}};
}

std::vector<ElementwiseOp> embedding_elementwise_ops(const ModelSpec& m) {
  if (m.embedding.tensors.empty()) // a bare parameter count has no embeddings
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

} // namespace shardplan::costmodel
