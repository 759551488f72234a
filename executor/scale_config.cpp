#include "executor/scale_config.hpp"

#include "documents/model.hpp"

namespace shardplan::executor {

nlohmann::json scaled_config(const std::string& source, const ScaledSize& size) {
  const auto scaled = scale_down(documents::load_model(source), size);
  nlohmann::json config = scaled.hf_config;
  // The dropout keys each architecture's reader knows (documents/model.cpp); 0 turns them off.
  if (config["architectures"][0] == "GPT2LMHeadModel") {
    for (const char* key : {"attn_pdrop", "resid_pdrop", "embd_pdrop"}) config[key] = 0.0;
  } else if (config.contains("attention_dropout")) {
    config["attention_dropout"] = 0.0;
  }
  config["_scaled_from"] = source;
  documents::model_from_hf_config(config, source);  // the cost model reads it back
  return config;
}

}  // namespace shardplan::executor
