// Model documents: exact parameter counts of the presets (examples/models/<name>/config.json) and
// of configs written inline, against independently published totals; and every rejection, with
// the one-line message and its JSON pointer.
//
// Each expected total is cited where it was published, and re-derived by hand beside it from the
// per-block formula (HF modeling_*.py layouts):
//   GPT-2 block    = ln_1 2h + c_attn (3h² + 3h) + c_proj (h² + h) + ln_2 2h
//                    + c_fc (4h² + 4h) + c_proj (4h² + h)              = 12h² + 13h
//   GPT-2 total    = wte V·h + wpe P·h + L·block + ln_f 2h             (head tied to wte)
//   Llama block    = q h·(a·d) + k, v 2·h·(k·d) + o (a·d)·h + gate/up/down 3·h·I + 2 RMSNorm 2h
//   Llama total    = embed V·h + L·block + norm h + lm_head V·h        (untied)
// with h hidden, a query heads, k kv heads, d head_dim, I intermediate, V vocab, P positions.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/json_reader.hpp"
#include "documents/model.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::core;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

// A preset's config.json as a JSON value, to be edited into a bad document.
json preset_config(const std::string& name) {
  return read_json_file(data_dir() + "/examples/models/" + name + "/config.json");
}

std::int64_t total_of(const std::string& preset) { return load_model(preset).total_params(); }

// EleutherAI/pythia-160m config.json, as published on the Hugging Face hub.
constexpr const char* kPythia160m = R"({
  "architectures": ["GPTNeoXForCausalLM"],
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "gelu",
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-05,
  "max_position_embeddings": 2048,
  "model_type": "gpt_neox",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "rotary_emb_base": 10000,
  "rotary_pct": 0.25,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.24.0",
  "use_cache": true,
  "use_parallel_residual": true,
  "vocab_size": 50304
})";

// Qwen/Qwen2-0.5B config.json, as published on the Hugging Face hub.
constexpr const char* kQwen2_0_5b = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 131072,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

}  // namespace

// ----------------------------------------------------------------------------------------------
// GPT-2 (openai-community/gpt2*): V = 50257, P = 1024, LayerNorm with bias, tied head.

TEST_CASE("model::gpt2 parameter count") {
  // Published: GPT2LMHeadModel.from_pretrained("gpt2").num_parameters() = 124,439,808
  // (HF transformers; the 124M model of Radford et al. 2019).
  // h = 768, L = 12: block = 12·589,824 + 13·768 = 7,087,872; 12 blocks = 85,054,464;
  // wte 50,257·768 = 38,597,376; wpe 1,024·768 = 786,432; ln_f 1,536;
  // total = 38,597,376 + 786,432 + 85,054,464 + 1,536 = 124,439,808.
  const auto m = load_model("gpt2");
  CHECK(m.architecture == Architecture::gpt2);
  CHECK(m.tied_embeddings);
  CHECK(m.block.params() == 7'087'872);
  CHECK(m.embedding.params() == 38'597'376 + 786'432);
  CHECK(m.head.params() == 1'536);
  CHECK(m.total_params() == 124'439'808);
}

TEST_CASE("model::gpt2-medium parameter count") {
  // Published: GPT2LMHeadModel.from_pretrained("gpt2-medium").num_parameters() = 354,823,168.
  // h = 1024, L = 24: block = 12·1,048,576 + 13·1,024 = 12,596,224; 24 blocks = 302,309,376;
  // wte 50,257·1,024 = 51,463,168; wpe 1,048,576; ln_f 2,048;
  // total = 51,463,168 + 1,048,576 + 302,309,376 + 2,048 = 354,823,168.
  const auto m = load_model("gpt2-medium");
  CHECK(m.block.params() == 12'596'224);
  CHECK(m.total_params() == 354'823'168);
}

TEST_CASE("model::gpt2-large parameter count") {
  // Published: GPT2LMHeadModel.from_pretrained("gpt2-large").num_parameters() = 774,030,080.
  // h = 1280, L = 36: block = 12·1,638,400 + 13·1,280 = 19,677,440; 36 blocks = 708,387,840;
  // wte 50,257·1,280 = 64,328,960; wpe 1,310,720; ln_f 2,560;
  // total = 64,328,960 + 1,310,720 + 708,387,840 + 2,560 = 774,030,080.
  const auto m = load_model("gpt2-large");
  CHECK(m.block.params() == 19'677'440);
  CHECK(m.total_params() == 774'030'080);
}

TEST_CASE("model::gpt2-xl parameter count") {
  // Published: GPT2LMHeadModel.from_pretrained("gpt2-xl").num_parameters() = 1,557,611,200.
  // h = 1600, L = 48: block = 12·2,560,000 + 13·1,600 = 30,740,800; 48 blocks = 1,475,558,400;
  // wte 50,257·1,600 = 80,411,200; wpe 1,638,400; ln_f 3,200;
  // total = 80,411,200 + 1,638,400 + 1,475,558,400 + 3,200 = 1,557,611,200.
  const auto m = load_model("gpt2-xl");
  CHECK(m.heads == 25);
  CHECK(m.head_dim == 64);
  CHECK(m.block.params() == 30'740'800);
  CHECK(m.total_params() == 1'557'611'200);
}

// ----------------------------------------------------------------------------------------------
// Llama family: RMSNorm (weight only), SwiGLU, no biases, untied lm_head.

TEST_CASE("model::llama-2-7b parameter count and block") {
  // Published: 6,738,415,616 = LlamaForCausalLM.num_parameters() of meta-llama/Llama-2-7b-hf;
  // llama.cpp writes the same integer as general.parameter_count into Llama-2-7B GGUF files.
  // h = 4096, a = k = 32, d = 128, I = 11008, L = 32, V = 32000:
  // block = 4·4096² (q, k, v, o) 67,108,864 + 3·4096·11008 135,266,304 + 2·4096 8,192
  //       = 202,383,360; 32 blocks = 6,476,267,520;
  // embed + lm_head 2·32000·4096 = 262,144,000; norm 4,096;
  // total = 6,476,267,520 + 262,144,000 + 4,096 = 6,738,415,616.
  const auto m = load_model("llama-2-7b");
  CHECK(m.architecture == Architecture::llama);
  CHECK_FALSE(m.tied_embeddings);
  CHECK(m.head_dim == 128);
  CHECK(m.block.params() == 202'383'360);
  CHECK(m.block.matmul_params() == 202'383'360 - 8'192);
  CHECK(m.embedding.params() == 131'072'000);
  CHECK(m.head.params() == 131'072'000 + 4'096);
  CHECK(m.total_params() == 6'738'415'616);
}

TEST_CASE("model::llama-2-13b parameter count") {
  // Published: 13,015,864,320 = LlamaForCausalLM.num_parameters() of meta-llama/Llama-2-13b-hf.
  // h = 5120, a = k = 40, I = 13824, L = 40:
  // block = 4·5120² 104,857,600 + 3·5120·13824 212,336,640 + 2·5120 10,240 = 317,204,480;
  // 40 blocks = 12,688,179,200; embed + lm_head 2·32000·5120 = 327,680,000; norm 5,120;
  // total = 12,688,179,200 + 327,680,000 + 5,120 = 13,015,864,320.
  const auto m = load_model("llama-2-13b");
  CHECK(m.block.params() == 317'204'480);
  CHECK(m.total_params() == 13'015'864'320);
}

TEST_CASE("model::llama-2-70b parameter count") {
  // Published: 68,976,648,192 = LlamaForCausalLM.num_parameters() of meta-llama/Llama-2-70b-hf
  // (the "69B" of the hub's model page).
  // h = 8192, a = 64, k = 8 (GQA), d = 128, I = 28672, L = 80:
  // q, o 2·8192² = 134,217,728; k, v 2·8192·1024 = 16,777,216; MLP 3·8192·28672 = 704,643,072;
  // norms 16,384; block = 855,654,400; 80 blocks = 68,452,352,000;
  // embed + lm_head 2·32000·8192 = 524,288,000; norm 8,192;
  // total = 68,452,352,000 + 524,288,000 + 8,192 = 68,976,648,192.
  const auto m = load_model("llama-2-70b");
  CHECK(m.kv_heads == 8);
  CHECK(m.kv_width() == 1024);
  CHECK(m.block.params() == 855'654'400);
  CHECK(m.total_params() == 68'976'648'192);
}

TEST_CASE("model::llama-3-8b parameter count") {
  // Published: 8,030,261,248 = the hub API's safetensors "total" of meta-llama/Meta-Llama-3-8B
  // (shown as "8.03B params").
  // h = 4096, a = 32, k = 8, d = 128, I = 14336, L = 32, V = 128256:
  // q, o 2·4096² = 33,554,432; k, v 2·4096·1024 = 8,388,608; MLP 3·4096·14336 = 176,160,768;
  // norms 8,192; block = 218,112,000; 32 blocks = 6,979,584,000;
  // embed + lm_head 2·128256·4096 = 1,050,673,152; norm 4,096;
  // total = 6,979,584,000 + 1,050,673,152 + 4,096 = 8,030,261,248.
  const auto m = load_model("llama-3-8b");
  CHECK(m.block.params() == 218'112'000);
  CHECK(m.total_params() == 8'030'261'248);
}

TEST_CASE("model::llama-3-70b parameter count") {
  // Published: 70,553,706,496 = the hub API's safetensors "total" of the Llama 3 70B checkpoints
  // (shown as "70.6B params"); GGUF general.parameter_count of their conversions is the same.
  // The Llama-2-70b block (h = 8192, k = 8, I = 28672) = 855,654,400; 80 blocks = 68,452,352,000;
  // embed + lm_head 2·128256·8192 = 2,101,346,304; norm 8,192;
  // total = 68,452,352,000 + 2,101,346,304 + 8,192 = 70,553,706,496.
  const auto m = load_model("llama-3-70b");
  CHECK(m.block.params() == 855'654'400);
  CHECK(m.total_params() == 70'553'706'496);
}

TEST_CASE("model::llama-3.1-405b parameter count") {
  // Published: 405,853,388,800 = the hub's safetensors "total" of meta-llama/Llama-3.1-405B.
  // Block (h = 16384, 128 heads of 128, k = 8 kv heads, I = 53248): q and o 2·16384² =
  // 536,870,912; k and v 2·16384·1024 = 33,554,432; MLP 3·16384·53248 = 2,617,245,696; norms
  // 2·16384 = 32,768; block = 3,187,703,808; 126 blocks = 401,650,679,808; embed + lm_head
  // 2·128256·16384 = 4,202,692,608; norm 16,384; total = 405,853,388,800.
  const auto m = load_model("llama-3.1-405b");
  CHECK(m.block.params() == 3'187'703'808);
  CHECK(m.total_params() == 405'853'388'800);
}

TEST_CASE("model::mistral-7b parameter count") {
  // Published: 7,241,732,096 = general.parameter_count of Mistral-7B GGUF conversions (llama.cpp)
  // and the hub's "7.24B params" for mistralai/Mistral-7B-v0.1.
  // The Llama-3-8b block (h = 4096, k = 8, I = 14336) = 218,112,000; 32 blocks = 6,979,584,000;
  // embed + lm_head 2·32000·4096 = 262,144,000; norm 4,096;
  // total = 6,979,584,000 + 262,144,000 + 4,096 = 7,241,732,096.
  const auto m = load_model("mistral-7b");
  CHECK(m.architecture == Architecture::mistral);
  CHECK(m.block.params() == 218'112'000);
  CHECK(m.total_params() == 7'241'732'096);
}

TEST_CASE("model::every preset loads") {
  for (const auto& name : preset_model_names()) {
    CAPTURE(name);
    const auto m = load_model(name);
    CHECK(m.name == name);
    CHECK(m.total_params() > 0);
  }
  CHECK(total_of("gpt2") < total_of("gpt2-medium"));
}

// ----------------------------------------------------------------------------------------------
// Configs of other supported architectures, written out as the hub publishes them.

TEST_CASE("model::gpt-neox pythia-160m parameter count") {
  // Published: the Pythia model cards (EleutherAI/pythia-160m) list 162,322,944 total and
  // 85,056,000 non-embedding parameters for "160M" (Biderman et al. 2023).
  // h = 768, I = 3072, L = 12, V = 50304, LayerNorm with bias, biases everywhere, untied embed_out:
  // block = 2 LayerNorms 3,072 + query_key_value 768·2304 + 2304 = 1,771,776
  //       + dense 768² + 768 = 590,592 + dense_h_to_4h 768·3072 + 3072 = 2,362,368
  //       + dense_4h_to_h 3072·768 + 768 = 2,360,064 = 7,087,872; 12 blocks = 85,054,464;
  // embed_in + embed_out 2·50304·768 = 77,266,944; final_layer_norm 1,536;
  // total = 77,266,944 + 85,054,464 + 1,536 = 162,322,944.
  const auto m = model_from_hf_config(parse_json_text(kPythia160m, "pythia-160m"), "pythia-160m");
  CHECK(m.architecture == Architecture::gpt_neox);
  CHECK(m.parallel_residual);
  CHECK(m.norm == NormKind::layernorm);
  CHECK(m.positions == PositionKind::rotary);
  CHECK(m.block.params() == 7'087'872);
  CHECK(m.total_params() == 162'322'944);
}

TEST_CASE("model::gpt-neox-20b parameter count") {
  // Published: the EleutherAI/gpt-neox-20b model card gives 20,554,567,680 parameters (Black et
  // al. 2022). h = 6144, I = 24576, L = 44, V = 50432, biases everywhere, untied embed_out:
  // block = 12h² + 13h (the GPT-2 block with I = 4h) = 452,984,832 + 79,872 = 453,064,704;
  // 44 blocks = 19,934,846,976; embed_in + embed_out 2·50432·6144 = 619,708,416; final LN 12,288;
  // total = 19,934,846,976 + 619,708,416 + 12,288 = 20,554,567,680.
  // Its config.json carries legacy keys (attention_probs_dropout_prob, hidden_dropout_prob) that
  // GPTNeoXConfig never read; they must be accepted, not rejected.
  const char* config = R"({
    "architectures": ["GPTNeoXForCausalLM"],
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "gelu_fast",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 6144,
    "initializer_range": 0.02,
    "intermediate_size": 24576,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": 64,
    "num_hidden_layers": 44,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": false,
    "torch_dtype": "float16",
    "transformers_version": "4.19.0.dev0",
    "use_cache": true,
    "vocab_size": 50432
  })";
  const auto m = model_from_hf_config(parse_json_text(config, "gpt-neox-20b"), "gpt-neox-20b");
  CHECK(m.block.params() == 453'064'704);
  CHECK(m.total_params() == 20'554'567'680);
}

TEST_CASE("model::qwen2 0.5b parameter count") {
  // Published: 494,032,768 = Qwen2ForCausalLM.num_parameters() of Qwen/Qwen2-0.5B ("0.49B" on the
  // hub); llama.cpp reports n_params 494032768 for its GGUF conversions (tied embeddings).
  // h = 896, a = 14, k = 2, d = 64 (kv width 128), I = 4864, L = 24, V = 151936:
  // q 896² + 896 = 803,712; k, v 2·(896·128 + 128) = 229,632; o 896² = 802,816 (no bias);
  // MLP 3·896·4864 = 13,074,432; norms 1,792; block = 14,912,384; 24 blocks = 357,897,216;
  // embed_tokens 151936·896 = 136,134,656 (lm_head tied); norm 896;
  // total = 136,134,656 + 357,897,216 + 896 = 494,032,768.
  const auto m = model_from_hf_config(parse_json_text(kQwen2_0_5b, "qwen2-0.5b"), "qwen2-0.5b");
  CHECK(m.architecture == Architecture::qwen2);
  CHECK(m.tied_embeddings);
  CHECK(m.head_dim == 64);
  CHECK(m.block.params() == 14'912'384);
  CHECK(m.head.params() == 896);
  CHECK(m.total_params() == 494'032'768);
}

TEST_CASE("model::explicit head_dim and llama biases") {
  // head_dim need not be hidden / heads (LlamaAttention reads config.head_dim when present):
  // q, o 2·(512·(8·128)) = 1,048,576; k, v 2·512·(2·128) = 262,144;
  // attention_bias adds q, k, v, o biases 1024 + 256 + 256 + 512 = 2,048;
  // MLP 3·512·1024 = 1,572,864; norms 1,024; block = 2,886,656.
  json c = preset_config("llama-2-7b");
  c["hidden_size"] = 512;
  c["intermediate_size"] = 1024;
  c["num_attention_heads"] = 8;
  c["num_key_value_heads"] = 2;
  c["head_dim"] = 128;
  c["num_hidden_layers"] = 2;
  c["attention_bias"] = true;
  const auto m = model_from_hf_config(c, "small");
  CHECK(m.q_width() == 1024);
  CHECK(m.block.params() == 2'886'656);
}

TEST_CASE("model::bare parameter count") {
  const auto m = model_from_param_count(7.5e9);
  CHECK(m.architecture == Architecture::uniform);
  CHECK(m.total_params() == 7'500'000'000);
  CHECK(m.layers >= 1);
  const auto m2 = model_from_param_count(1.75e11, 96);
  CHECK(m2.layers == 96);
  CHECK(m2.total_params() == 175'000'000'000);
  CHECK(error_of([] { model_from_param_count(-1); }) ==
        "--params: must be between 1e3 and 1e15, got -1");
}

// ----------------------------------------------------------------------------------------------
// Rejections: one line, naming the JSON pointer and the value.

TEST_CASE("model::unsupported architecture names the supported ones") {
  json c = preset_config("llama-2-7b");
  c["architectures"] = json::array({"BertForMaskedLM"});
  CHECK(error_of([&] { model_from_hf_config(c, "bert"); }) ==
        "/architectures/0: unsupported architecture \"BertForMaskedLM\"; supported: "
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, "
        "GPTNeoXForCausalLM, MPTForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, "
        "Qwen3MoeForCausalLM, OlmoeForCausalLM");
}

TEST_CASE("model::heads must divide the hidden size") {
  json c = preset_config("gpt2");
  c["n_head"] = 7;
  CHECK(error_of([&] { model_from_hf_config(c, "gpt2"); }) ==
        "/n_head: 7 heads do not divide n_embd = 768");
  json l = preset_config("llama-2-7b");
  l["num_attention_heads"] = 30;
  l["num_key_value_heads"] = 30;
  CHECK(error_of([&] { model_from_hf_config(l, "llama"); }) ==
        "/num_attention_heads: 30 heads do not divide hidden_size = 4096");
}

TEST_CASE("model::key/value heads must divide the query heads") {
  json c = preset_config("llama-3-8b");
  c["num_key_value_heads"] = 3;
  CHECK(error_of([&] { model_from_hf_config(c, "llama-3-8b"); }) ==
        "/num_key_value_heads: 3 key/value heads do not divide 32 query heads");
}

TEST_CASE("model::zero layers") {
  json c = preset_config("llama-2-7b");
  c["num_hidden_layers"] = 0;
  CHECK(error_of([&] { model_from_hf_config(c, "llama"); }) ==
        "/num_hidden_layers: must be >= 1, got 0");
}

TEST_CASE("model::negative vocab") {
  json c = preset_config("mistral-7b");
  c["vocab_size"] = -32000;
  CHECK(error_of([&] { model_from_hf_config(c, "mistral"); }) ==
        "/vocab_size: must be >= 1, got -32000");
}

TEST_CASE("model::unknown key") {
  json c = preset_config("llama-2-7b");
  c["num_hiden_layers"] = 32;
  CHECK(error_of([&] { model_from_hf_config(c, "llama"); }) == "/num_hiden_layers: unknown key");
}

TEST_CASE("model::wrong type") {
  json c = preset_config("llama-2-7b");
  c["hidden_size"] = "4096";
  CHECK(error_of([&] { model_from_hf_config(c, "llama"); }) ==
        "/hidden_size: must be an integer, got \"4096\"");
  json g = preset_config("gpt2");
  g["n_layer"] = 12.5;
  CHECK(error_of([&] { model_from_hf_config(g, "gpt2"); }) ==
        "/n_layer: must be an integer, got 12.5");
}

TEST_CASE("model::missing key") {
  json c = preset_config("llama-2-7b");
  c.erase("intermediate_size");
  CHECK(error_of([&] { model_from_hf_config(c, "llama"); }) == "/intermediate_size: missing key");
  json a = preset_config("gpt2");
  a.erase("architectures");
  CHECK(error_of([&] { model_from_hf_config(a, "gpt2"); }) == "/architectures: missing key");
}

TEST_CASE("model::unknown preset or file") {
  const auto e = error_of([] { load_model("llama-9-1b"); });
  CHECK(e.rfind("--model: \"llama-9-1b\" is neither a preset (gpt2, ", 0) == 0);
}

// ----------------------------------------------------------------------------------------------
// Keys that choose the code a training step runs (transformers 5.23): modelled, or refused by
// name with their value.

TEST_CASE("model::mlp activation by name") {
  // GPT2Config's default activation_function is "gelu_new", GPTNeoXConfig's hidden_act "gelu";
  // names running the same ops (transformers/activations.py ACT2CLS) share a value.
  CHECK(load_model("gpt2").activation == Activation::gelu_new);
  json g = preset_config("gpt2");
  g.erase("activation_function");
  CHECK(model_from_hf_config(g, "gpt2").activation == Activation::gelu_new);
  const std::vector<std::pair<std::string, Activation>> names = {
      {"gelu", Activation::gelu},
      {"gelu_pytorch_tanh", Activation::gelu_tanh},
      {"gelu_fast", Activation::gelu_fast},
      {"gelu_accurate", Activation::gelu_new},
      {"gelu_python", Activation::gelu_erf},
      {"quick_gelu", Activation::quick_gelu},
      {"swish", Activation::silu},
      {"linear", Activation::identity}};
  for (const auto& entry : names) {
    const std::string& name = entry.first;  // a plain reference: CAPTURE's lambda takes it
    CAPTURE(name);
    g["activation_function"] = name;
    CHECK(model_from_hf_config(g, "gpt2").activation == entry.second);
  }
  json n = parse_json_text(kPythia160m, "pythia");
  CHECK(model_from_hf_config(n, "pythia").activation == Activation::gelu);
  n.erase("hidden_act");
  CHECK(model_from_hf_config(n, "pythia").activation == Activation::gelu);
  CHECK(load_model("llama-2-7b").activation == Activation::silu);
}

TEST_CASE("model::unmodelled activations are refused") {
  const std::string supported =
      "unsupported activation; supported: gelu, gelu_new, gelu_pytorch_tanh, gelu_python_tanh, "
      "gelu_accurate, gelu_fast, gelu_python, gelu_10, quick_gelu, relu, silu, swish, linear; ";
  json g = preset_config("gpt2");
  g["activation_function"] = "mish";
  CHECK(error_of([&] { model_from_hf_config(g, "gpt2"); }) ==
        "/activation_function: " + supported + "got \"mish\"");
  json n = parse_json_text(kPythia160m, "pythia");
  n["hidden_act"] = "xielu";  // XIELUActivation adds parameters of its own
  CHECK(error_of([&] { model_from_hf_config(n, "pythia"); }) ==
        "/hidden_act: " + supported + "got \"xielu\"");
  json l = preset_config("llama-2-7b");
  l["hidden_act"] = "gelu";
  CHECK(error_of([&] { model_from_hf_config(l, "llama"); }) ==
        "/hidden_act: must be \"silu\" for a SwiGLU MLP, got \"gelu\"");
}

TEST_CASE("model::gpt2 attention switches") {
  json g = preset_config("gpt2");
  // Both only change the Python float GPT2Attention scales the scores by.
  g["scale_attn_weights"] = false;
  g["scale_attn_by_inverse_layer_idx"] = true;
  CHECK(model_from_hf_config(g, "gpt2").total_params() == 124'439'808);
  g["reorder_and_upcast_attn"] = false;
  g["add_cross_attention"] = false;
  CHECK(model_from_hf_config(g, "gpt2").total_params() == 124'439'808);
  g["reorder_and_upcast_attn"] = true;
  CHECK(error_of([&] { model_from_hf_config(g, "gpt2"); }) ==
        "/reorder_and_upcast_attn: the upcast, reordered attention is not supported, got true");
  g["reorder_and_upcast_attn"] = false;
  g["add_cross_attention"] = true;
  CHECK(error_of([&] { model_from_hf_config(g, "gpt2"); }) ==
        "/add_cross_attention: cross-attention blocks are not supported, got true");
}

TEST_CASE("model::mistral sliding window") {
  // MistralConfig: sliding_window defaults to 4096; null means none.
  CHECK(load_model("mistral-7b").sliding_window == 4096);
  json c = preset_config("mistral-7b");
  c.erase("sliding_window");
  CHECK(model_from_hf_config(c, "mistral").sliding_window == 4096);
  c["sliding_window"] = nullptr;
  CHECK(model_from_hf_config(c, "mistral").sliding_window == 0);
  c["sliding_window"] = 48;
  CHECK(model_from_hf_config(c, "mistral").sliding_window == 48);
  c["sliding_window"] = 0;
  CHECK(error_of([&] { model_from_hf_config(c, "mistral"); }) ==
        "/sliding_window: must be >= 1, got 0");
  // Llama has no window: the key is never read by modeling_llama.py.
  json l = preset_config("llama-2-7b");
  l["sliding_window"] = 4096;
  CHECK(model_from_hf_config(l, "llama").sliding_window == 0);
}

TEST_CASE("model::qwen2 sliding window only in some layers is refused") {
  json q = parse_json_text(kQwen2_0_5b, "qwen2");
  CHECK(model_from_hf_config(q, "qwen2").sliding_window == 0);  // use_sliding_window false
  q["use_sliding_window"] = true;                               // max_window_layers 24 = layers
  CHECK(model_from_hf_config(q, "qwen2").sliding_window == 0);
  q["max_window_layers"] = 20;
  CHECK(error_of([&] { model_from_hf_config(q, "qwen2"); }) ==
        "/use_sliding_window: true gives layers 20 to 23 a sliding window and the others none; "
        "blocks that differ are not supported, got true");
  q["sliding_window"] = nullptr;  // no window: every layer is full attention
  CHECK(model_from_hf_config(q, "qwen2").sliding_window == 0);
}

TEST_CASE("model::rotary fraction") {
  // Llama's rope tables span the whole head: a factor below 1 is refused, wherever it is given.
  json l = preset_config("llama-3-8b");
  l["partial_rotary_factor"] = 1.0;
  CHECK(model_from_hf_config(l, "llama").rotary_dim == 128);
  l["partial_rotary_factor"] = 0.5;
  CHECK(error_of([&] { model_from_hf_config(l, "llama"); }) ==
        "/partial_rotary_factor: LlamaForCausalLM rotates whole heads; only 1 is supported, got "
        "0.5");
  l.erase("partial_rotary_factor");
  l["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}};
  CHECK(error_of([&] { model_from_hf_config(l, "llama"); }) ==
        "/rope_parameters/partial_rotary_factor: LlamaForCausalLM rotates whole heads; only 1 is "
        "supported, got 0.25");
  l["rope_parameters"] = nullptr;
  CHECK(model_from_hf_config(l, "llama").rotary_dim == 128);
  // GPT-NeoX: rotary_pct (default 0.25), overridden by rope_parameters' partial_rotary_factor.
  json n = parse_json_text(kPythia160m, "pythia");
  CHECK(model_from_hf_config(n, "pythia").rotary_dim == 16);  // 0.25 of 64
  n["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  CHECK(model_from_hf_config(n, "pythia").rotary_dim == 32);
  n["rope_parameters"]["partial_rotary_factor"] = 2;
  CHECK(error_of([&] { model_from_hf_config(n, "pythia"); }) ==
        "/rope_parameters/partial_rotary_factor: must be a number in (0, 1], got 2");
}

TEST_CASE("model::gpt-neox hidden_dropout also drops the embeddings") {
  json n = parse_json_text(kPythia160m, "pythia");
  CHECK_FALSE(model_from_hf_config(n, "pythia").embedding_dropout);
  n["hidden_dropout"] = 0.1;
  const auto m = model_from_hf_config(n, "pythia");
  CHECK(m.embedding_dropout);
  CHECK(m.residual_dropout);
}

TEST_CASE("model::common switches are refused when on") {
  json c = preset_config("llama-2-7b");
  c["output_attentions"] = false;
  c["gradient_checkpointing"] = false;
  c["quantization_config"] = nullptr;
  c["_attn_implementation"] = nullptr;
  CHECK(model_from_hf_config(c, "llama").layers == 32);
  auto refused = [&](const char* key, const json& value) {
    json bad = preset_config("llama-2-7b");
    bad[key] = value;
    return error_of([&] { model_from_hf_config(bad, "llama"); });
  };
  CHECK(refused("output_attentions", true) ==
        "/output_attentions: true forces eager attention; remove it and choose the attention in "
        "the job, got true");
  CHECK(refused("gradient_checkpointing", true) ==
        "/gradient_checkpointing: true checkpoints every layer at load; remove it and choose the "
        "checkpointing in the job, got true");
  CHECK(refused("_attn_implementation", "eager") ==
        "/_attn_implementation: the attention implementation is the job's setting; remove it, "
        "got \"eager\"");
  CHECK(refused("attn_implementation", "flash_attention_2") ==
        "/attn_implementation: the attention implementation is the job's setting; remove it, got "
        "\"flash_attention_2\"");
  CHECK(
      refused("quantization_config", {{"quant_method", "gptq"}}) ==
      "/quantization_config: quantized models are not supported, got {\"quant_method\":\"gptq\"}");
  CHECK(refused("auto_map", {{"AutoModelForCausalLM", "modeling.MyModel"}}) ==
        "/auto_map: custom-code models are not supported, got "
        "{\"AutoModelForCausalLM\":\"modeling.MyModel\"}");
}
