// llm-foundry's MPT config.json (documents/model_mpt.cpp): per-unit parameter counts against
// llm-foundry 0.22.0's own MPTForCausalLM built from the same config
// (tests/documents/data/mpt_params.json, validation/measure_mpt_params.py), an MPT-7B-shaped model
// derived by hand, and every rejection with its pointer.
#include <doctest/doctest.h>

#include <string>

#include "core/json_reader.hpp"
#include "documents/model.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::core;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

json tiny_mpt() {
  return {{"architectures", {"MPTForCausalLM"}},
          {"model_type", "mpt"},
          {"d_model", 64},
          {"n_heads", 4},
          {"n_layers", 2},
          {"expansion_ratio", 4},
          {"max_seq_len", 32},
          {"vocab_size", 128}};
}

}  // namespace

TEST_CASE("model_mpt::every unit's parameters are llm-foundry's own MPT's") {
  const json corpus =
      read_json_file(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/documents/data/mpt_params.json");
  int cases = 0;
  for (const auto& c : corpus.at("cases")) {
    const std::string id = c.at("id").get<std::string>();
    CAPTURE(id);
    const ModelSpec m = model_from_hf_config(c.at("config"), id);
    const auto& p = c.at("params");
    CHECK(m.architecture == Architecture::mpt);
    CHECK(m.embedding.params() == p.at("embedding").get<std::int64_t>());
    CHECK(m.block.params() == p.at("block").get<std::int64_t>());
    CHECK(m.head.params() == p.at("head").get<std::int64_t>());
    CHECK(m.total_params() == p.at("total").get<std::int64_t>());
    ++cases;
  }
  CHECK(cases == 17);
}

TEST_CASE("model_mpt::an MPT-7B-shaped model: 6,649,286,656 parameters") {
  // MPT-7B's shape (d_model 4096, 32 heads, 32 layers, expansion 4, vocab 50432, ALiBi, no
  // biases, tied embeddings). By hand: wte 50432·4096 = 206,569,472; a block Wqkv 3·4096² +
  // out_proj 4096² + up and down 2·4·4096² + two bias-free norms 2·4096 = 201,334,784, times 32 =
  // 6,442,713,088; norm_f 4096: 6,649,286,656.
  json c = tiny_mpt();
  c["d_model"] = 4096;
  c["n_heads"] = 32;
  c["n_layers"] = 32;
  c["max_seq_len"] = 2048;
  c["vocab_size"] = 50432;
  c["no_bias"] = true;
  c["attn_config"] = {{"alibi", true}, {"attn_impl", "torch"}, {"clip_qkv", nullptr}};
  c["auto_map"] = {{"AutoConfig", "configuration_mpt.MPTConfig"},
                   {"AutoModelForCausalLM", "modeling_mpt.MPTForCausalLM"}};
  const ModelSpec m = model_from_hf_config(c, "mpt-7b");
  CHECK(m.total_params() == 6649286656);
  CHECK(m.block.params() == 201334784);
  CHECK(m.positions == PositionKind::alibi);
  CHECK(m.tied_embeddings);
  CHECK(m.norm == NormKind::layernorm);
  CHECK(m.mlp == MlpKind::gelu);
  CHECK(m.activation == Activation::gelu);  // F.gelu, exact: ffn_act_fn's default
  CHECK(m.intermediate == 4 * 4096);
}

TEST_CASE("model_mpt::the switches it reads: GQA, GLU, rope, a window") {
  json c = tiny_mpt();
  c["attn_config"] = {{"attn_type", "grouped_query_attention"},
                      {"kv_n_heads", 2},
                      {"rope", true},
                      {"sliding_window_size", 16},
                      {"attn_pdrop", 0.1}};
  c["ffn_config"] = {
      {"ffn_type", "mptglu"}, {"ffn_hidden_size", 96}, {"ffn_act_fn", {{"name", "silu"}}}};
  c["resid_pdrop"] = 0.1;
  const ModelSpec m = model_from_hf_config(c, "mpt");
  CHECK(m.kv_heads == 2);
  CHECK(m.positions == PositionKind::rotary);
  CHECK(m.rotary_dim == 16);
  CHECK(m.sliding_window == 16);
  CHECK(m.attention_dropout);
  CHECK(m.residual_dropout);
  CHECK_FALSE(m.embedding_dropout);
  CHECK(m.mlp == MlpKind::swiglu);
  CHECK(m.activation == Activation::silu);
  CHECK(m.intermediate == 96);
}

TEST_CASE("model_mpt::rejections name the key and the value") {
  auto refused = [](const json& c) { return error_of([&] { model_from_hf_config(c, "mpt"); }); };
  json c = tiny_mpt();
  c["attn_config"] = {{"attn_type", "grouped_query_attention"}};
  CHECK(refused(c) == "/attn_config/kv_n_heads: grouped_query_attention needs it");
  c["attn_config"] = {{"attn_type", "grouped_query_attention"}, {"kv_n_heads", 3}};
  CHECK(refused(c) == "/attn_config/kv_n_heads: 3 key/value heads do not divide 4 heads");
  c["attn_config"] = {{"attn_type", "cross_attention"}};
  CHECK(refused(c) == "/attn_config/attn_type: must be one of multihead_attention, "
                      "multiquery_attention, grouped_query_attention, got \"cross_attention\"");
  c["attn_config"] = {{"attn_impl", "triton"}};
  CHECK(refused(c) == "/attn_config/attn_impl: must be one of flash, torch, got \"triton\"");
  c["attn_config"] = {{"sliding_window_size", 0}};
  CHECK(refused(c) == "/attn_config/sliding_window_size: must be -1 (none) or a window, got 0");
  c["attn_config"] = {{"kv_dim", 32}};
  CHECK(refused(c) == "/attn_config/kv_dim: is not supported; leave it null");
  c["attn_config"] = {{"nope", true}};
  CHECK(refused(c) == "/attn_config/nope: is not supported, got true");
  c["attn_config"] = {{"attn_temperature_tuning", {{"floor_scale", 8192}, {"attn_scale", 0.1}}}};
  CHECK(refused(c) == "/attn_config/attn_temperature_tuning: attention temperature tuning is not "
                      "supported; attn_scale must be 0");
  c["attn_config"] = {{"qk_layernorm", true}};
  CHECK(refused(c) == "/attn_config/qk_layernorm: unknown key");
  c = tiny_mpt();
  c["ffn_config"] = {{"ffn_type", "te_ln_mlp"}};
  CHECK(refused(c) == "/ffn_config/ffn_type: must be one of mptmlp, mptglu, got \"te_ln_mlp\"");
  c["ffn_config"] = {{"ffn_act_fn", {{"name", "mish"}}}};
  CHECK(refused(c) ==
        "/ffn_config/ffn_act_fn/name: must be one of gelu, silu, relu, quick_gelu, got \"mish\"");
  c = tiny_mpt();
  c["expansion_ratio"] = 2.0078125;  // 64 x (2 + 1/128), exact in binary
  CHECK(refused(c) ==
        "/expansion_ratio: d_model x expansion_ratio must be a whole number, got 128.5");
  c = tiny_mpt();
  c["norm_type"] = "triton_rmsnorm";
  CHECK(refused(c) == "/norm_type: must be one of low_precision_layernorm, layernorm, rmsnorm, "
                      "low_precision_rmsnorm, got \"triton_rmsnorm\"");
  c = tiny_mpt();
  c["fc_type"] = "te";
  CHECK(refused(c) == "/fc_type: must be one of torch, got \"te\"");
  c = tiny_mpt();
  c["block_overrides"] = {{"order", json::array()}, {"overrides", json::object()}};
  CHECK(refused(c) == "/block_overrides: is not supported; leave it null");
  c = tiny_mpt();
  c["n_heads"] = 5;
  CHECK(refused(c) == "/n_heads: 5 heads do not divide d_model = 64");
  c = tiny_mpt();
  c["mystery"] = 1;
  CHECK(refused(c) == "/mystery: unknown key");
}
