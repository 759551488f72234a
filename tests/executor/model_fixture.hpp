// A whole model for the tests: one parameter and one gradient buffer per unit, and a
// forward + backward over all units in order (what the sharding engine does, without sharding).
#pragma once

#include <random>
#include <span>
#include <vector>

#include "documents/model.hpp"
#include "executor/gpt_model.hpp"
#include "executor/param_init.hpp"
#include "executor/scaled_model.hpp"
#include "executor/tracked_allocator.hpp"

namespace shardplan::executor::testing {

using namespace shardplan::kernels;

// Tiny models of the three families (a few thousand parameters each; 2 blocks unless told).
// Llama-like: GQA (4 query heads, 2 key/value heads), explicit head_dim 6 ≠ hidden/heads,
// SwiGLU, RMSNorm, rotary, untied head.
inline documents::ModelSpec tiny_llama(std::int64_t layers = 2) {
  return scale_down(documents::load_model("llama-3-8b"), {.layers = layers,
                                                          .hidden = 16,
                                                          .heads = 4,
                                                          .kv_heads = 2,
                                                          .head_dim = 6,
                                                          .intermediate = 24,
                                                          .vocab = 50,
                                                          .max_positions = 64});
}
// GPT-2-like: LayerNorm with biases, learned positions, GELU, biases everywhere, tied head.
inline documents::ModelSpec tiny_gpt2(std::int64_t layers = 2) {
  return scale_down(documents::load_model("gpt2"), {.layers = layers,
                                                    .hidden = 16,
                                                    .heads = 4,
                                                    .intermediate = 32,
                                                    .vocab = 50,
                                                    .max_positions = 12});
}
// GPT-NeoX-like: parallel residual, fused query_key_value, rotary, LayerNorm, GELU, untied.
inline documents::ModelSpec tiny_neox() {
  const nlohmann::json config = {{"architectures", {"GPTNeoXForCausalLM"}},
                                 {"hidden_size", 16},
                                 {"intermediate_size", 32},
                                 {"num_hidden_layers", 2},
                                 {"num_attention_heads", 4},
                                 {"vocab_size", 50},
                                 {"max_position_embeddings", 64}};
  return documents::model_from_hf_config(config, "tiny-neox");
}

// fp32 values rounded to S (scalar.hpp's narrow): the compute type's copy of fp32 parameters.
template <class S>
TrackedBuffer<S> narrowed(TrackedAllocator& allocator, MemoryCategory category,
                          std::span<const float> values) {
  auto out = allocator.allocate_uninitialized<S>(category, std::ssize(values));
  for (std::size_t i = 0; i < values.size(); ++i) out.data()[i] = narrow<S>(values[i]);
  return out;
}

// A forward over every unit in order (and with backward, the backward, adding the gradients into
// grads[u]), wherever the buffers live: one flat parameter and one gradient buffer per unit, the
// tied head reading unit 0. Returns the mean cross-entropy.
template <class S>
double forward_backward(const GptModel<S>& model, const std::vector<TrackedBuffer<S>>& params,
                        std::vector<TrackedBuffer<S>>& grads, std::span<const std::int32_t> tokens,
                        std::span<const std::int32_t> targets, BatchShape shape,
                        Checkpointing checkpointing, bool backward) {
  auto p = [&](std::int64_t u) { return params[static_cast<std::size_t>(u)].span(); };
  auto g = [&](std::int64_t u) { return grads[static_cast<std::size_t>(u)].span(); };
  const auto last = static_cast<std::int64_t>(params.size()) - 1;
  auto x = model.forward_embedding(p(0), tokens, shape);
  std::vector<BlockActivations<S>> saved;
  for (std::int64_t u = 1; u < last; ++u) {
    auto f = model.forward_block(p(u), std::move(x), shape, checkpointing);
    x = std::move(f.output);
    saved.push_back(std::move(f.saved));
  }
  auto head = model.forward_head(p(last), p(0), std::move(x), targets, shape);
  if (!backward) return head.loss;
  auto dx = model.backward_head(p(last), p(0), std::move(head.saved), targets, g(last), g(0));
  for (std::int64_t u = last - 1; u >= 1; --u)
    dx = model.backward_block(p(u), std::move(saved[static_cast<std::size_t>(u - 1)]),
                              std::move(dx), g(u));
  model.backward_embedding(tokens, std::move(dx), g(0), shape);
  return head.loss;
}

template <class S> struct WholeModel {
  GptModel<S> model;
  std::vector<TrackedBuffer<S>> params;  // one flat buffer per unit
  std::vector<TrackedBuffer<S>> grads;

  WholeModel(const documents::ModelSpec& spec, TrackedAllocator& allocator, std::uint64_t seed)
      : model(spec, allocator) {
    const auto& layout = model.layout();
    for (std::int64_t u = 0; u < layout.unit_count(); ++u) {
      params.push_back(allocator.allocate<S>(MemoryCategory::parameters, layout.unit_size_of(u)));
      grads.push_back(allocator.allocate<S>(MemoryCategory::gradients, layout.unit_size_of(u)));
      init_unit_params<S>(layout, u, seed, 0, params.back().span());
    }
  }

  std::int64_t units() const { return static_cast<std::int64_t>(params.size()); }
  std::span<const S> p(std::int64_t u) const { return params[static_cast<std::size_t>(u)].span(); }
  std::span<S> g(std::int64_t u) { return grads[static_cast<std::size_t>(u)].span(); }

  // Moves every parameter away from its initial value (norm weights off 1, biases off 0), so a
  // gradient check sees a generic point with logits of order one.
  void perturb(std::uint64_t seed, double amplitude) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<double> u(-amplitude, amplitude);
    for (auto& b : params)
      for (auto& x : b.span()) x += static_cast<S>(u(gen));
  }

  void zero_grads() {
    for (auto& b : grads)
      for (auto& x : b.span()) x = S(0);
  }

  // Mean cross-entropy; with backward, adds the gradients of the loss into grads.
  double run(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
             BatchShape shape, Checkpointing checkpointing, bool backward) {
    return forward_backward(model, params, grads, tokens, targets, shape, checkpointing, backward);
  }
};

}  // namespace shardplan::executor::testing
