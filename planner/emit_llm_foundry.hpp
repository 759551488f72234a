// `--emit llm-foundry`: the keys of llm-foundry's train YAML that set what a plan was costed with,
// for the user to merge into the YAML that names their data, tokenizer, optimizer and schedule
// (llm-foundry 0.22.0: scripts/train/train.py reads it into TrainConfig,
// llmfoundry/utils/config_utils.py): max_seq_len, global_train_batch_size,
// device_train_microbatch_size, precision, Composer's fsdp_config (composer 0.32:
// composer/utils/parallelism.py, FSDPConfig), and for an MPT config.json the model section
// llm-foundry builds ComposerMPTCausalLM from (its MPTConfig keys, the loss_fn).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// The settings as data, in the YAML's order. Throws core::InputError at "--emit" for a plan
// llm-foundry does not run as costed: another recipe's code, another engine than Composer's FSDP1
// (fsdp-full, fsdp-grad-op, hsdp), a prefetch deeper than FSDP1's own, offload (Composer refuses
// FSDP's CPUOffload), checkpointing other than none or every block, pure bf16 parameters, or an MPT
// loss other than llm-foundry's two.
nlohmann::ordered_json llm_foundry_settings(const Scenario& sc, const Evaluation& e);
// The same as YAML, after comment lines that say what the plan assumes and predicts.
std::string llm_foundry_yaml(const Scenario& sc, const Evaluation& e);

}  // namespace shardplan::planner
