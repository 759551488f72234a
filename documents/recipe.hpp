// What each recipe's training code does, as data: one row per framework (recipe.cpp, kRecipes).
// The cost model, the search, the emitters and the checks read these fields; none of them asks
// which recipe runs. Adding a framework is its Recipe value (documents/job.hpp), its row here and
// its corpus cases; a row that needs a behaviour no field describes adds the field, and the one
// place that reads it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "documents/job.hpp"
#include "documents/parallel.hpp"
#include "documents/sharding.hpp"

namespace shardplan::documents {

// How a block's saved activations are counted (costmodel/block_table.cpp):
//   per_op     from the framework's own model code, tensor by tensor, as autograd saves them
//              (checked against tests/costmodel/data/oracle_units.json)
//   korthikanti  Korthikanti et al. 2022's per-layer formula as Megatron-core's GPT keeps it (the
//              executor's model keeps the same tensors: executor/gpt_model.hpp)
enum class SavedTensors { per_op, korthikanti };

// The RMSNorm a Llama-family block runs:
//   upcast  transformers' LlamaRMSNorm: the input cast to fp32, its statistics and the normalized
//           value kept (costmodel/block_table.cpp, rmsnorm)
//   torch   torch's F.rms_norm / _fused_rms_norm (torchtitan's nn.RMSNorm)
//   fused   Megatron-core's fused norm: its input and output
enum class RmsNormCode { upcast, torch, fused };

// The linears its block code calls (costmodel/block_linears.cpp, block_matmuls):
//   model          the model's own, in its architecture's order (transformers', the executor's)
//   torchtitan     torchtitan's Llama block: one fused wqkv, wo, w1, w3, w2
//   megatron_core  Megatron-core's TransformerLayer: linear_qkv (q, k and v as one GEMM),
//                  linear_proj, linear_fc1 (gate and up as one GEMM when gated), linear_fc2
enum class BlockLinears { model, torchtitan, megatron_core };

// Whose tensor parallelism splits the block, the embeddings and the head:
//   megatron_core  Megatron-core's column/row-parallel linears, vocabulary-parallel embedding and
//                  cross-entropy (Korthikanti et al. 2022, §4)
//   torch_styles   PyTorch's parallel styles (torch/distributed/tensor/parallel/style.py) as the
//                  recipe's plan applies them (the embedding and loss fields below)
enum class TensorParallelCode { megatron_core, torch_styles };
// The embeddings and norms under torch's styles: in no plan (transformers' tp_plan: replicated
// plain tensors), or planned (torchtitan: the table RowwiseParallel, whose gradient comes back
// whole, the norms SequenceParallel DTensors).
enum class TpEmbedding { unplanned, rowwise };
// The loss under torch's styles: on logits gathered whole (transformers' lm_head "colwise_rep")
// or on the rank's vocabulary columns (torchtitan's loss_parallel).
enum class TpLoss { gathered, loss_parallel };
// Async tensor parallelism (the sequence-parallel all-gathers and reduce-scatters run in pieces
// beside the GEMMs that use them) as the recipe's framework runs it, and what it keeps:
//   none              its tensor parallelism has no such mode (transformers' tp_plan, DeepSpeed's
//                     AutoTP, the executor)
//   symmetric_memory  torch's micro-pipeline TP (Inductor's _micro_pipeline_tp pass under
//                     torch.compile; torchtitan's compile.enable_async_tensor_parallel): fused
//                     all-gather-matmul and matmul-reduce-scatter ops exchanging through one
//                     symmetric-memory workspace per TP group
//   userbuffers       Transformer Engine's comm-GEMM overlap (Megatron-LM's --tp-comm-overlap):
//                     a registered communication buffer per overlapped GEMM
enum class AsyncTp { none, symmetric_memory, userbuffers };

// Who runs a pipeline's stages, and so their op order (costmodel/parallel_memory.hpp,
// stage_orders) and what the runner keeps around each op (costmodel/pipeline_walk.cpp,
// stage_buffers):
//   megatron          Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py)
//   torch_pipelining  torch.distributed.pipelining's PipelineStage and schedules (torchtitan)
//   deepspeed         DeepSpeed's PipelineEngine running its TrainSchedule
//                     (deepspeed/runtime/pipe/engine.py, schedule.py)
//   executor          this project's trainer (executor/pipeline.cpp)
//   none              its trainer runs no pipeline
enum class PipelineRunner { megatron, torch_pipelining, deepspeed, executor, none };

// Whose ring attention context parallelism runs (costmodel/context_ring.hpp): torch's
// context_parallel (all-gather rotation), or Transformer Engine's p2p ring.
// executor: this project's own ring (executor/context_parallel.hpp), each exchange waited for.
// none: its trainer runs no ring.
enum class RingCode { torch_all_gather, te_p2p, executor, none };

struct RecipeTraits {
  Recipe recipe;
  const char* name;             // as on the command line and in documents
  const char* description;      // the reference code it counts, in a few words
  LossImpl loss;                // its loss unless the job names one
  Checkpointing checkpointing;  // its checkpointing unless the job names one

  // The model code.
  bool framework;  // a framework's own code and engine (false: this project's executor, whose
                   // engine gathers, reduces and steps its own way: costmodel/simulator.cpp)
  SavedTensors saved;
  RmsNormCode rmsnorm;
  // transformers' PreTrainedModel code: the model's forward builds position ids and the causal
  // mask and computes rotary cos/sin tables once per forward that every block reads; sdpa gets an
  // explicit mask for a sliding window and repeat_kv'd keys beyond head_dim 256
  // (integrations/sdpa_attention.py); ForCausalLMLoss shifts the labels; a checkpointed GPT-2 keeps
  // the eager mask it is handed; activation_checkpointing_enable is its checkpointing call.
  bool transformers_code;
  // torchtitan's Llama: one fused wqkv GEMM split into q, k, v, and complex-number rotary
  // embeddings from a module buffer (freqs_cis).
  bool fused_qkv_complex_rope;
  BlockLinears linears;
  // torch.utils.checkpoint's early stop (its default): the rerun ends at the last tensor backward
  // needs. torchtitan wraps its blocks with early_stop=False.
  bool checkpoint_early_stop;
  // every:N counts blocks from 1 (torchtitan 0.2's selective_ac_option = "N": blocks N−1, 2N−1,
  // ...) rather than from 0 (transformers' every_n_layers: blocks 0, N, 2N, ...).
  bool every_n_from_one;

  // Under model parallelism: the dimensions its trainer runs (a layout naming another is refused,
  // and the search leaves it out), then how it runs them.
  bool offers_tensor_parallel;
  // Sequence parallelism as Megatron-LM's --sequence-parallel and torchtitan's plan make it: the
  // residual stream's tokens split over the TP group.
  bool offers_sequence_parallel;
  bool offers_context_parallel;  // ring attention over a sequence split (RingCode)
  TensorParallelCode tensor_parallel;
  TpEmbedding tp_embedding;  // under torch_styles
  TpLoss tp_loss;            // under torch_styles
  AsyncTp async_tp;
  PipelineRunner pipeline;
  // Those its runner has, the first its default; none where its trainer runs no pipeline.
  std::vector<PipelineSchedule> schedules;
  // The embeddings and the head counted as blocks of the first and last stage by default
  // (torchtitan's pipeline_parallel_first/last_stage_less_layers = 1).
  int pipeline_less_layers;
  bool pipeline_even_split;  // the blocks must divide evenly over the parts (Megatron-LM)
  // How its FSDP2 groups the parameters unless the job names it (documents/job.hpp, Fsdp2Groups).
  Fsdp2Groups fsdp2_groups;
  // An MPT config.json runs llm-foundry's own MPT (llmfoundry/models/mpt): the recipe's code has
  // it (documents/model_mpt.cpp reads the config, costmodel's block_table counts its block).
  bool runs_mpt;
  RingCode ring;

  // What its configs offer (the search's alternatives, the emitters).
  std::vector<Flavour> flavours;    // the data-parallel engines it runs under
  bool offers_every_n;              // every:N checkpointing
  bool offers_selective_op;         // torchtitan's op-level save list
  bool offers_selective_attention;  // Megatron's selective recompute, where attention is eager
  // torch.compile of each block and of the loss, as its trainer applies it and as measured
  // (costmodel/block_table.cpp: the compiled block's saved tensors); false where not measured.
  bool compiles_blocks;
  // torchao's Float8 training of its linears (TrainingJob::float8), as its converter applies it
  // (torchtitan's Float8LinearConverter); false where the recipe has no such option modeled.
  bool offers_float8;
  bool reduces_in_fp32_only;  // torchtitan's mixed_precision_reduce takes "float32" only
  // FSDP1's backward_prefetch when the plan names none (--backward-prefetch): BACKWARD_PRE
  // (torch's default) or none: transformers' Trainer passes its fsdp_config backward_prefetch,
  // "NO_PREFETCH" unless set (training_args.py), to accelerate's FullyShardedDataParallelPlugin,
  // which gives FSDP None.
  bool fsdp1_backward_prefetch;
  // FSDP's mixed precision when the job names none (documents/sharding.hpp, FsdpMixedPrecision).
  FsdpMixedPrecision fsdp_mixed_precision;
  // Its training loop runs the forward under autocast beside FSDP, which is what computes in 16
  // bits when FSDP gathers fp32 parameters (FsdpMixedPrecision::full).
  bool autocast_with_fsdp;
  // The --emit that writes its model-parallel layouts as its framework reads them ("torchtitan",
  // "megatron", "deepspeed"); "" where none is written (a layout of another framework's options
  // would run that framework's code, not this recipe's).
  const char* layout_emit;
  // Where its PyTorch model keeps the transformer blocks (a Python expression on `model`) and their
  // class ("module:Class"), for the emitted FSDP wrapping; empty where the recipe's model code is
  // transformers' (per architecture: planner/emit_fsdp.cpp) or no PyTorch module the user wraps.
  const char* blocks_at;
  const char* block_class;

  bool runs_under(Flavour f) const;
  // The engine a strategy runs under when no flavour is named: the first of `flavours` that
  // implements it (Megatron's DDP and distributed optimizer for its recipe), else the strategy's
  // default (documents::default_flavour).
  Flavour flavour_for(const std::string& strategy) const;
  std::string flavour_list() const;  // "fsdp2 or ddp"
  // The model-parallel dimensions its trainer runs, as a phrase: "tensor, pipeline and context
  // parallelism", "tensor and context parallelism"; "" where it runs none.
  std::string model_parallel_dimensions() const;
};

inline constexpr int kRecipes = 6;  // the rows, one per Recipe
const RecipeTraits& recipe_traits(Recipe r);

}  // namespace shardplan::documents
