// The training job document and the cluster: what the user fixes before the planner chooses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "documents/hardware.hpp"

namespace shardplan::documents {

// Precision policies (names as on the command line and in documents):
//   fp32        everything fp32 (tf32 GEMMs where the GPU has them)
//   bf16-mixed  bf16 compute with fp32 master weights and fp32 optimizer states
//   fp16-mixed  as bf16-mixed, fp16 compute with dynamic loss scaling
//   bf16        pure bf16: weights, gradients and optimizer states in bf16
enum class Precision { fp32, bf16_mixed, fp16_mixed, bf16 };
enum class Optimizer { adamw, adam, sgd, adafactor };
// Activation checkpointing, by what the frameworks' options do:
//   none                 every block keeps what autograd saves
//   full                 every block keeps only its inputs and reruns its forward in backward (HF
//                        gradient_checkpointing_enable, torchtitan mode="full", Megatron full)
//   every:N              every N-th block fully checkpointed, the others keep everything
//                        (transformers activation_checkpointing_enable(every_n_layers=N);
//                        torchtitan 0.2 mode="selective", selective_ac_option="N")
//   selective-attention  Megatron --recompute-granularity selective: the attention core is
//                        recomputed; with flash attention there is nothing left to drop, so it
//                        equals none ("selective" is accepted as this name)
//   selective-op         torchtitan selective_ac_option="op": outputs of the ops on its save list
//                        (attention, every second matmul) kept, the rest recomputed
enum class Checkpointing { none, full, every, selective_attention, selective_op };
enum class AttentionImpl { flash, eager };  // fused (no s×s scores kept) or materialized scores
// How the loss turns the last hidden states into a scalar (see costmodel/accounting.hpp):
//   upcast        logits in the compute dtype, cross_entropy on an fp32 copy (HF ForCausalLMLoss,
//                 torchtitan's cross_entropy_loss)
//   fused         a fused cross-entropy kernel: the logits and one log-sum-exp per token
//                 (flash-attn's CrossEntropyLoss, llm-foundry's default; a torch.compile'd loss)
//   chunked:N     the sequence split into N chunks, each chunk's logits, loss and gradient
//                 computed in the forward (torchtitan's ChunkedLossWrapper, num_chunks = N)
//   fused-linear  Liger's fused linear cross-entropy: chunked:N with Liger's chunk rule
//   fp32-inplace  Megatron's vocab-parallel cross-entropy: an fp32 copy turned into the softmax
//                 in place and saved; the backward writes the gradient over it
enum class LossImpl { upcast, fused, chunked, fused_linear, fp32_inplace };
// The training code the job runs: its model code decides what autograd keeps per block and at the
// head (costmodel/accounting.cpp), and its loss is the job's unless the job names another. What
// each one's code does is one row of documents/recipe.hpp.
//   hf           transformers *ForCausalLM with its own loss (Trainer, accelerate, TRL)
//   torchtitan   torchtitan's Llama with its cross_entropy_loss
//   llm-foundry  an HF-style block with flash-attn's fused cross-entropy (llm-foundry's default)
//   megatron     Megatron-core GPT: fp32 softmax of the logits, gradient computed in place
//   deepspeed    an HF model under the DeepSpeed engine (its activation_checkpointing section)
//   executor     this project's executor (executor/gpt_model.hpp): what `executor` runs
enum class Recipe { hf, torchtitan, llm_foundry, megatron, deepspeed, executor };
const char* recipe_name(Recipe r);
Recipe recipe_from_name(const std::string& s, const std::string& where);
const std::vector<std::string>& recipe_names();

const char* precision_name(Precision p);
const char* optimizer_name(Optimizer o);
const char* checkpointing_name(Checkpointing c);  // the mode alone ("every", not "every:2")
const char* loss_name(LossImpl l);
const char* attention_name(AttentionImpl a);
Precision precision_from_name(const std::string& s, const std::string& where);
Optimizer optimizer_from_name(const std::string& s, const std::string& where);
AttentionImpl attention_from_name(const std::string& s, const std::string& where);
const std::vector<std::string>& precision_names();
const std::vector<std::string>& optimizer_names();
const std::vector<std::string>& checkpointing_names();
const std::vector<std::string>& loss_names();

// The dtype GEMMs run in, and its element size, for a policy.
DType compute_dtype(Precision p);

// FSDP's mixed precision (MixedPrecision, MixedPrecisionPolicy) by the names Composer gives its
// settings (composer/distributed/mosaic_parallelism.py, get_mixed_precision), for a job whose
// compute dtype is 16-bit:
//   default  param_dtype the compute dtype, reduce_dtype fp32
//   pure     param_dtype and reduce_dtype the compute dtype
//   full     neither set: gathered and reduced in the parameters' fp32, autocast computing
enum class FsdpMixedPrecision { default_mode, pure, full };
const std::vector<std::string>& fsdp_mixed_precision_names();  // default pure full
FsdpMixedPrecision fsdp_mixed_precision_from_name(const std::string& s, const std::string& where);
const char* fsdp_mixed_precision_name(FsdpMixedPrecision m);
const char* fsdp_mixed_precision_label(FsdpMixedPrecision m);  // Composer's: DEFAULT PURE FULL

// How FSDP2 groups the model's parameters (one fully_shard call per group):
//   root  each block, then the root holding the embeddings, the final norm and the head
//         (fully_shard(block) for each, then fully_shard(model): torch's FSDP2 example)
//   ends  the embedding its own group, each block, the final norm with the head one group kept
//         gathered from its forward to its backward, the root holding what is left
//         (torchtitan's apply_fsdp; accelerate's fsdp2_prepare_model, which transformers'
//         Trainer runs)
enum class Fsdp2Groups { root, ends };
const std::vector<std::string>& fsdp2_groups_names();  // root ends
Fsdp2Groups fsdp2_groups_from_name(const std::string& s, const std::string& where);
const char* fsdp2_groups_name(Fsdp2Groups g);

// torchao's Float8 training of the linears (torchao 0.18, float8/config.py,
// Float8LinearConfig.from_recipe_name; torchtitan 0.3.0's Float8LinearConverter offers these two):
//   none                the linears' GEMMs in the compute dtype
//   rowwise             input, weight and output gradient cast to e4m3 with a scale per row
//                       (axiswise), all three GEMMs of a linear in fp8 (torchtitan's default)
//   rowwise_with_gw_hp  rowwise for the output and the input gradient; the weight gradient's GEMM
//                       stays in the compute dtype, on the unscaled input and output gradient
enum class Float8Recipe { none, rowwise, rowwise_with_gw_hp };
const std::vector<std::string>& float8_recipe_names();  // none rowwise rowwise_with_gw_hp
Float8Recipe float8_recipe_from_name(const std::string& s, const std::string& where);
const char* float8_recipe_name(Float8Recipe r);

struct TrainingJob {
  std::int64_t seq_len = 4096;    // tokens per sequence
  std::int64_t global_batch = 0;  // sequences per optimizer step, whole job
  std::int64_t micro_batch =
      0;  // sequences per GPU per forward/backward; 0 = let the planner choose
  Precision precision = Precision::bf16_mixed;
  Optimizer optimizer = Optimizer::adamw;
  Checkpointing checkpointing = Checkpointing::none;
  std::int64_t checkpoint_every = 0;  // N of every:N (blocks N-1, 2N-1, ... are checkpointed)
  AttentionImpl attention = AttentionImpl::flash;
  LossImpl loss = LossImpl::upcast;
  std::int64_t loss_chunks = 0;  // N of chunked:N: chunks the sequence is split into
  Recipe recipe = Recipe::hf;
  // FSDP's mixed precision as the job names it (nullopt: the recipe's; RecipeTraits).
  std::optional<FsdpMixedPrecision> fsdp_mixed_precision;
  // torch.compile as the recipe applies it (torchtitan's --compile.enable: each block compiled,
  // and the loss; RecipeTraits::compiles_blocks).
  bool compile = false;
  // Float8 training of the linears and the modules it skips: torchtitan's filter_fqns, each a
  // substring of a linear's fully qualified name ("lm_head", "attention.wo"); linears whose
  // sizes are not multiples of 16 are always skipped (module_filter_fn).
  Float8Recipe float8 = Float8Recipe::none;
  std::vector<std::string> float8_filter;
  // FSDP2's groups as the job names them (nullopt: the recipe's; RecipeTraits::fsdp2_groups).
  std::optional<Fsdp2Groups> fsdp2_groups;

  // Whether block b (0-based) keeps only its input and reruns its forward in backward. every:N
  // counts as the recipe's code does: transformers' activation_checkpointing_enable(every_n_layers)
  // checkpoints layers 0, N, 2N, ... (modeling_utils.py, _set_gradient_checkpointing);
  // torchtitan 0.2's selective_ac_option = "N" the N-th, 2N-th, ... (a counter from 1;
  // RecipeTraits::every_n_from_one).
  bool block_checkpointed(std::int64_t b) const;
};

// "every:2", "chunked:4096": the option as written on the command line.
std::string checkpointing_label(const TrainingJob& j);
std::string loss_label(const TrainingJob& j);
// Parse "none", "full", "every:N", "selective-attention" (alias "selective"), "selective-op" into
// the job; `where` names the flag or JSON pointer in errors.
void set_checkpointing(TrainingJob& j, const std::string& s, const std::string& where);
// Parse "upcast", "fused", "chunked:N", "fused-linear".
void set_loss(TrainingJob& j, const std::string& s, const std::string& where);

struct Cluster {
  int gpus = 0;           // N
  int gpus_per_node = 0;  // G; N must be a multiple of G unless N < G
  int nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
};

// The training-job document ({"schema_version": 1, "seq_len": ..., ...}); throws InputError.
TrainingJob job_from_json(const nlohmann::json& doc);
nlohmann::json job_to_json(const TrainingJob& job);
// Checks the numbers against each other and the cluster; the message says what would work.
// `global_batch_field`, `micro_batch_field`: what a message names for each (the flag, or the job
// document's key where the value came from there).
void validate_job(const TrainingJob& job, const Cluster& cluster,
                  const std::string& global_batch_field = "--global-batch",
                  const std::string& micro_batch_field = "--micro-batch");
void validate_cluster(const Cluster& cluster);

}  // namespace shardplan::documents
