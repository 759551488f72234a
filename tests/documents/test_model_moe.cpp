// transformers' mixtures of experts (documents/model_moe.cpp): per-unit, total and active
// parameter counts and each block tensor's shape against transformers 5.23's own classes built
// from the same config.json (tests/documents/data/moe_params.json,
// validation/measure_moe_params.py), Mixtral-8x7B by hand, every rejection with its pointer, and
// the planner's refusal to plan their step.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "core/json_reader.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::core;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

json corpus() {
  return read_json_file(std::string(SHARDPLAN_SOURCE_DIR) +
                        "/tests/documents/data/moe_params.json");
}

const json& config_of(const json& c, const std::string& id) {
  for (const auto& k : c.at("cases"))
    if (k.at("id") == id) return k.at("config");
  throw std::runtime_error("no case " + id);
}

// name -> elements, from the corpus's [name, shape] rows and from the reader's tensors.
std::map<std::string, std::int64_t> measured_tensors(const json& rows) {
  std::map<std::string, std::int64_t> out;
  for (const auto& row : rows) {
    std::int64_t n = 1;
    for (const auto& d : row.at(1)) n *= d.get<std::int64_t>();
    out[row.at(0).get<std::string>()] = n;
  }
  return out;
}
std::map<std::string, std::int64_t> read_tensors(const UnitTensors& u) {
  std::map<std::string, std::int64_t> out;
  for (const auto& t : u.tensors) out[t.name] = t.elements();
  return out;
}

std::string refused(const std::string& id, const std::string& key, const json& value) {
  json c = config_of(corpus(), id);
  c[key] = value;
  return error_of([&] { model_from_hf_config(c, id); });
}

}  // namespace

TEST_CASE("model_moe::every unit's parameters, the active ones and each tensor are "
          "transformers' own") {
  int cases = 0;
  const json data = corpus();
  for (const auto& c : data.at("cases")) {
    const std::string id = c.at("id").get<std::string>();
    CAPTURE(id);
    if (id.rfind("deepseek", 0) == 0) {  // MLA attention: not read yet
      CHECK(error_of([&] {
              model_from_hf_config(c.at("config"), id);
            }).rfind("/architectures/0: unsupported architecture \"DeepseekV3ForCausalLM\"", 0) ==
            0);
      continue;
    }
    const ModelSpec m = model_from_hf_config(c.at("config"), id);
    const auto& p = c.at("params");
    CHECK(m.embedding.params() == p.at("embedding").get<std::int64_t>());
    CHECK(m.block.params() == p.at("block").get<std::int64_t>());
    CHECK(m.head.params() == p.at("head").get<std::int64_t>());
    CHECK(m.total_params() == p.at("total").get<std::int64_t>());
    CHECK(m.active_params() == c.at("active").get<std::int64_t>());
    CHECK(read_tensors(m.block) == measured_tensors(c.at("tensors")));
    ++cases;
  }
  CHECK(cases == 7);
}

TEST_CASE("model_moe::Mixtral-8x7B: 46,702,792,704 parameters, 12,879,925,248 active") {
  // Mixtral-8x7B's config.json shape (h 4096, 32 layers, 32 heads, 8 key/value heads, experts of
  // 14336, 8 experts, top-2, vocab 32000, untied). By hand: attention 2·4096² + 2·1024·4096 =
  // 41,943,040, two norms 8,192, the router 8·4096 = 32,768, each expert 3·4096·14336 =
  // 176,160,768, eight 1,409,286,144: a block 1,451,270,144, 32 of them 46,440,644,608; the
  // embeddings and the head 32000·4096 = 131,072,000 each, the final norm 4,096:
  // 46,702,792,704. A token skips 6 experts a block: 32·6·176,160,768 = 33,822,867,456 fewer.
  json c = config_of(corpus(), "mixtral-default");
  c["hidden_size"] = 4096;
  c["num_hidden_layers"] = 32;
  c["num_attention_heads"] = 32;
  c["num_key_value_heads"] = 8;
  c["head_dim"] = 128;
  c["intermediate_size"] = 14336;
  c["num_local_experts"] = 8;
  c["vocab_size"] = 32000;
  const ModelSpec m = model_from_hf_config(c, "mixtral-8x7b");
  CHECK(m.total_params() == 46702792704);
  CHECK(m.active_params() == 12879925248);
  CHECK(m.moe.experts == 8);
  CHECK(m.moe.top_k == 2);
  CHECK(m.moe.normalize_top_k);  // MixtralSparseMoeBlock always renormalizes the top-k weights
  CHECK(m.architecture == Architecture::mixtral);
}

TEST_CASE("model_moe::the switches it reads: counts by either name, the aux loss, norms") {
  json q3 = config_of(corpus(), "qwen3-moe");
  CHECK(model_from_hf_config(q3, "q").qk_norm == QkNorm::head);
  q3["num_experts"] = 8;  // the alias, equal: accepted
  CHECK(model_from_hf_config(q3, "q").moe.experts == 8);
  json olmoe = config_of(corpus(), "olmoe");
  CHECK(model_from_hf_config(olmoe, "o").qk_norm == QkNorm::width);
  CHECK(model_from_hf_config(olmoe, "o").moe.aux_loss_coef == 0);  // output_router_logits false
  olmoe["output_router_logits"] = true;
  CHECK(model_from_hf_config(olmoe, "o").moe.aux_loss_coef == 0.01);
  olmoe["clip_qkv"] = 8.0;
  CHECK(model_from_hf_config(olmoe, "o").clip_qkv);
  json mixtral = config_of(corpus(), "mixtral-default");
  mixtral["sliding_window"] = 4096;
  CHECK(model_from_hf_config(mixtral, "m").sliding_window == 4096);
  mixtral["router_jitter_noise"] = 0.01;
  CHECK(model_from_hf_config(mixtral, "m").moe.router_jitter);
}

TEST_CASE("model_moe::rejections name the key and the value") {
  CHECK(refused("qwen3-moe", "decoder_sparse_step", 2) ==
        "/decoder_sparse_step: 2 makes every block but each 2th dense; blocks that differ are "
        "not supported, got 2");
  CHECK(refused("qwen2-moe-shared", "mlp_only_layers", json::array({0})) ==
        "/mlp_only_layers: dense blocks beside sparse ones are not supported, got [0]");
  CHECK(refused("qwen3-moe", "use_sliding_window", true) ==
        "/use_sliding_window: windowed blocks beside full ones are not supported, got true");
  CHECK(refused("qwen2-moe-shared", "layer_types",
                json::array({"full_attention", "sliding_attention"})) ==
        "/layer_types: every block's attention must be \"full_attention\", got "
        "\"sliding_attention\"");
  CHECK(refused("mixtral-default", "num_experts_per_tok", 5) ==
        "/num_experts_per_tok: routes each token to more experts than the 4 there are, got 5");
  CHECK(refused("olmoe", "num_local_experts", 4) ==
        "/num_experts: names the same count as num_local_experts (4), got 8");
  CHECK(refused("mixtral-default", "hidden_act", "gelu") ==
        "/hidden_act: must be \"silu\" for a SwiGLU MLP, got \"gelu\"");
  CHECK(refused("olmoe", "head_dim", 32) ==
        "/head_dim: OLMoE's k_norm spans (hidden_size / heads) x key/value heads; a head_dim "
        "other than 16 is not supported, got 32");
  CHECK(refused("mixtral-default", "norm_topk_prob", true) == "/norm_topk_prob: unknown key");
  CHECK(refused("qwen3-moe", "moe_intermediate_size", 0) ==
        "/moe_intermediate_size: must be >= 1, got 0");
}

TEST_CASE("model_moe::what of its step is not modeled is named") {
  // transformers' blocks on their default experts path are measured
  // (tests/costmodel/data/oracle_moe_units.json); other code and switches are named.
  const ModelSpec m = model_from_hf_config(config_of(corpus(), "olmoe"), "olmoe");
  TrainingJob j;
  CHECK(moe_unplanned(m, j).empty());  // hf
  j.recipe = Recipe::torchtitan;
  CHECK(moe_unplanned(m, j) == "the torchtitan recipe's own mixture-of-experts code is not "
                               "modeled; transformers' is (--recipe hf, deepspeed or llm-foundry)");
  j.recipe = Recipe::hf;
  j.compile = true;
  CHECK(moe_unplanned(m, j) == "--compile: what a compiled sparse block keeps is not measured");
  j.compile = false;
  json aux = config_of(corpus(), "olmoe");
  aux["output_router_logits"] = true;
  CHECK(moe_unplanned(model_from_hf_config(aux, "o"), j).rfind("output_router_logits: ", 0) == 0);
  CHECK(moe_unplanned(load_model("llama-2-7b"), j).empty());
}
