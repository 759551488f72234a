#include "costmodel/block_linears.hpp"
#include "documents/recipe.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::costmodel {

using documents::ModelSpec;
using documents::TrainingJob;

namespace {

// torchtitan 0.3.0's Llama block (models/common/attention.py: the attention's qkv_linear.wqkv, one
// GEMM split into q, k and v, then wo; models/common/feed_forward.py: w2(silu(w1(x)) * w3(x)));
// no biases. The names are the modules' paths inside the block, as its Float8 filter sees them.
std::vector<Matmul> torchtitan_matmuls(const ModelSpec& m) {
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width(), I = m.intermediate;
  return {{"attention.qkv_linear.wqkv", q + 2 * kv, h, false, true},
          {"attention.wo", h, q, true, true},
          {"feed_forward.w1", I, h, false, true},
          {"feed_forward.w3", I, h, false, true},
          {"feed_forward.w2", h, I, true, true}};
}

// Megatron-core 0.x, transformer/attention.py (SelfAttention's linear_qkv, linear_proj) and
// transformer/mlp.py (linear_fc1, twice the inner width when gated, linear_fc2). Its linears add
// their bias outside the GEMM (skip_bias_add), so each GEMM is a plain matmul.
std::vector<Matmul> megatron_matmuls(const ModelSpec& m) {
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width(), I = m.intermediate;
  const std::int64_t fc1 = m.mlp == documents::MlpKind::swiglu ? 2 * I : I;
  return {{"linear_qkv", q + 2 * kv, h, false, true},
          {"linear_proj", h, q, true, true},
          {"linear_fc1", fc1, h, false, true},
          {"linear_fc2", h, I, true, true}};
}

// The linears that write the residual width, by the name each architecture's code gives them
// (documents/model.cpp, model_mpt.cpp): Megatron's row-parallel pattern (Shoeybi et al. 2019,
// §3) applied to the attention's output projection and the MLP's second linear.
bool row_parallel(std::string_view linear) {
  constexpr std::array<std::string_view, 6> kRowParallel = {
      "o_proj", "down_proj", "c_proj", "attention.dense", "dense_4h_to_h", "out_proj"};
  return std::any_of(kRowParallel.begin(), kRowParallel.end(),
                     [&](std::string_view s) { return linear.ends_with(s); });
}

// The recipe's linears, before Float8 marks any.
std::vector<Matmul> model_matmuls(const ModelSpec& m, const TrainingJob& j) {
  // A model known by its parameter count alone (no heads) has only its own matrices.
  switch (m.heads > 0 ? documents::recipe_traits(j.recipe).linears
                      : documents::BlockLinears::model) {
  case documents::BlockLinears::torchtitan:
    return torchtitan_matmuls(m);
  case documents::BlockLinears::megatron_core:
    return megatron_matmuls(m);
  case documents::BlockLinears::model:
    break;
  }
  const auto named = [&](const std::string& name) {
    return std::any_of(m.block.tensors.begin(), m.block.tensors.end(),
                       [&](const documents::Tensor& t) { return t.name == name; });
  };
  std::vector<Matmul> mms;
  for (const auto& t : m.block.tensors) {
    if (!t.is_matrix()) continue;
    if (t.experts > 1) {
      // A fused experts tensor's grouped GEMM over the k·T routed rows: per token, one GEMM
      // top_k times as wide (its FLOPs; the small experts' lower efficiency is not modeled).
      mms.push_back({t.name, m.moe.top_k * t.rows, t.cols, false, true});
      continue;
    }
    const std::string base = t.name.substr(0, t.name.rfind('.'));
    mms.push_back({base, t.rows, t.cols, row_parallel(base), !named(base + ".bias")});
  }
  return mms;
}

bool matches(const std::string& fqn, const std::string& filter) {
  return fqn.find(filter) != std::string::npos;  // module_filter_fn: `filter_fqn in fqn`
}

}  // namespace

std::vector<Matmul> block_matmuls(const ModelSpec& m, const TrainingJob& j) {
  auto mms = model_matmuls(m, j);
  if (j.float8 != documents::Float8Recipe::none)
    for (auto& mm : mms) mm.fp8 = float8_converts(j, "layers.0." + mm.name, mm.out, mm.in);
  return mms;
}

bool float8_converts(const TrainingJob& j, const std::string& fqn, std::int64_t out,
                     std::int64_t in) {
  if (j.float8 == documents::Float8Recipe::none || out % 16 != 0 || in % 16 != 0) return false;
  return std::none_of(j.float8_filter.begin(), j.float8_filter.end(),
                      [&](const std::string& f) { return matches(fqn, f); });
}

bool float8_whole_block(const ModelSpec& m, const TrainingJob& j) {
  if (j.float8 == documents::Float8Recipe::none) return false;
  const auto mms = block_matmuls(m, j);
  return std::all_of(mms.begin(), mms.end(), [](const Matmul& mm) { return mm.fp8; });
}

bool head_float8(const ModelSpec& m, const TrainingJob& j) {
  return float8_converts(j, "lm_head", m.vocab, m.hidden);
}

std::string float8_filter_per_layer(const ModelSpec& m, const TrainingJob& j) {
  for (const auto& mm : model_matmuls(m, j))
    for (const auto& f : j.float8_filter)
      for (std::int64_t b = 1; b < m.layers; ++b)
        if (matches("layers." + std::to_string(b) + "." + mm.name, f) !=
            matches("layers.0." + mm.name, f))
          return f;
  return "";
}

}  // namespace shardplan::costmodel
