#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/input_error.hpp"
#include "executor/model_layout.hpp"
#include "executor/param_init.hpp"
#include "executor/scaled_model.hpp"
#include "model_fixture.hpp"

using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using shardplan::core::InputError;
using shardplan::documents::load_model;
using shardplan::documents::UnitTensors;

namespace {
std::int64_t offset_of(const UnitTensors& unit, const std::string& name) {
  std::int64_t offset = 0;
  for (const auto& t : unit.tensors) {
    if (t.name == name) return offset;
    offset += t.elements();
  }
  return kAbsent;
}
}  // namespace

TEST_CASE("executor::layout follows the cost model's tensor order") {
  const auto spec = tiny_llama();
  const GptLayout layout(spec);
  CHECK(layout.unit_count() == spec.layers + 2);
  CHECK(layout.embedding().size == spec.embedding.params());
  CHECK(layout.block().size == spec.block.params());
  CHECK(layout.head().size == spec.head.params());
  CHECK(layout.block().norm1.weight == 0);
  CHECK(layout.block().q.weight == offset_of(spec.block, "self_attn.q_proj.weight"));
  CHECK(layout.block().k.weight == offset_of(spec.block, "self_attn.k_proj.weight"));
  CHECK(layout.block().down.weight == offset_of(spec.block, "mlp.down_proj.weight"));
  CHECK(layout.block().gate.weight == offset_of(spec.block, "mlp.gate_proj.weight"));
  CHECK(layout.block().q.bias == kAbsent);
  CHECK(layout.head().output == offset_of(spec.head, "lm_head.weight"));

  // Fused q/k/v: the q rows, then the k rows, then the v rows of one tensor.
  const auto neox = tiny_neox();
  const GptLayout fused(neox);
  const auto qkv = offset_of(neox.block, "attention.query_key_value.weight");
  const auto qkv_bias = offset_of(neox.block, "attention.query_key_value.bias");
  CHECK(fused.block().q.weight == qkv);
  CHECK(fused.block().k.weight == qkv + neox.hidden * neox.hidden);
  CHECK(fused.block().v.weight == qkv + 2 * neox.hidden * neox.hidden);
  CHECK(fused.block().v.bias == qkv_bias + 2 * neox.hidden);
  CHECK(fused.block().norm2.weight == offset_of(neox.block, "post_attention_layernorm.weight"));

  const GptLayout tied(tiny_gpt2());
  CHECK(tied.head().output == kAbsent);
  CHECK(tied.embedding().positions == 50 * 16);
}

TEST_CASE("executor::scale_down keeps the architecture and re-derives the tensors") {
  const auto source = load_model("llama-3-8b");
  const auto small = scale_down(source, {.layers = 2, .hidden = 64, .heads = 4, .vocab = 100});
  CHECK(small.architecture == source.architecture);
  CHECK(small.layers == 2);
  CHECK(small.kv_heads == 1);        // 8 of 32 heads in the source: the same 1:4 ratio
  CHECK(small.intermediate == 224);  // 64 · 14336 / 4096
  CHECK(small.head_dim == 16);
  REQUIRE(small.block.tensors.size() == source.block.tensors.size());
  for (std::size_t i = 0; i < small.block.tensors.size(); ++i)
    CHECK(small.block.tensors[i].name == source.block.tensors[i].name);
  CHECK(small.total_params() ==
        100 * 64 + 2 * (2 * 64 + 64 * 64 * 2 + 2 * 16 * 64 + 3 * 224 * 64) + 64 + 100 * 64);

  const auto gpt2 =
      scale_down(load_model("gpt2"),
                 {.layers = 1, .hidden = 32, .heads = 2, .vocab = 50, .max_positions = 16});
  CHECK(gpt2.tied_embeddings);
  CHECK(gpt2.attention_dropout);
  CHECK(gpt2.intermediate == 128);
  CHECK(gpt2.embedding.params() == 50 * 32 + 16 * 32);

  CHECK_THROWS_WITH_AS(
      scale_down(load_model("gpt2"),
                 {.layers = 1, .hidden = 32, .heads = 4, .kv_heads = 2, .vocab = 50}),
      "--scale: GPT2LMHeadModel has no grouped-query attention (kv_heads 2 != "
      "heads 4)",
      InputError);
  CHECK_THROWS_WITH_AS(scale_down(source, {.layers = 1, .hidden = 30, .heads = 4, .vocab = 50}),
                       "--scale: 4 heads do not divide hidden 30", InputError);
  // A size the model's reader refuses is refused as the flag that gave it.
  CHECK_THROWS_WITH_AS(
      scale_down(load_model("gpt2"), {.layers = 1000000, .hidden = 64, .heads = 2, .vocab = 257}),
      "--layers: must be <= 100000, got 1000000", InputError);
  CHECK_THROWS_WITH_AS(
      scale_down(source, {.layers = 1000000, .hidden = 64, .heads = 4, .vocab = 100}),
      "--layers: must be <= 100000, got 1000000", InputError);
  const auto bare = shardplan::documents::model_from_param_count(1e9);
  CHECK_THROWS_WITH_AS(scale_down(bare, {.layers = 1, .hidden = 8, .heads = 2, .vocab = 8}),
                       "--scale: a bare parameter count has no architecture to scale down",
                       InputError);
}

TEST_CASE("executor::initial parameters do not depend on how a unit is split") {
  const GptLayout layout(tiny_llama());
  const std::int64_t n = layout.block().size;
  std::vector<float> whole(static_cast<std::size_t>(n)), parts(static_cast<std::size_t>(n) + 3);
  init_unit_params<float>(layout, 1, 42, 0, whole);
  // Three shards of a flat buffer padded by 3 elements (padding is zero).
  const std::int64_t shard = (n + 3) / 3;
  for (std::int64_t r = 0; r < 3; ++r)
    init_unit_params<float>(layout, 1, 42, r * shard,
                            std::span(parts).subspan(static_cast<std::size_t>(r * shard),
                                                     static_cast<std::size_t>(shard)));
  CHECK(std::equal(whole.begin(), whole.end(), parts.begin()));
  CHECK(parts.back() == 0.0f);
  // Norm weights start at 1; another unit or seed gives other matrices.
  CHECK(whole[0] == 1.0f);
  std::vector<float> other(static_cast<std::size_t>(n));
  init_unit_params<float>(layout, 2, 42, 0, other);
  CHECK(other[0] == 1.0f);
  CHECK(other != whole);
}
