// ParallelLayout: the model-parallel dimensions of a plan beside the data-parallel ShardingSpec.
// Tensor parallelism t (Megatron's column/row-parallel linears, optionally with sequence
// parallelism in the norms and dropouts), pipeline parallelism p with its schedule, virtual stages
// v and micro-batches m, and context parallelism c (ring attention over a load-balanced causal
// split). Data parallelism (DDP/ZeRO/FSDP/HSDP, the ShardingSpec) spans what is left:
// d = world / (t·p·c).
//
// Mesh order, outermost to innermost: pp, dp, cp, tp (torchtitan's ParallelDims order,
// torchtitan/distributed/parallel_dims.py; Megatron-LM's default order tp-cp-dp-pp also puts tp
// innermost and pp outermost). Consecutive ranks share a node, so TP groups never leave a node
// and pipeline neighbours are t·c·d ranks apart (the cost model's layout_groups).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "documents/job.hpp"
#include "documents/model.hpp"

namespace shardplan::documents {

// 1f1b: PipeDream-flush (Narayanan et al. 2021, §2.2.1); interleaved-1f1b: Megatron's interleaved
// schedule with v model chunks per stage (§2.2.2); gpipe: all forwards, then all backwards.
enum class PipelineSchedule { one_f_one_b, interleaved_1f1b, gpipe };
const char* schedule_name(PipelineSchedule s);  // "1f1b", "interleaved-1f1b", "gpipe"
PipelineSchedule schedule_from_name(const std::string& s, const std::string& where);
const std::vector<std::string>& schedule_names();
// How torch's ring attention passes the keys and values round the context-parallel ranks
// (torch/distributed/tensor/experimental/_context_parallel/_attention.py, _RotateMethod;
// torchtitan's parallelism.context_parallel_rotate_method): all-gathered once (the default), or
// passed to the next rank at each of the c steps (all-to-all permutes).
enum class CpRotate { all_gather, all_to_all };
const char* cp_rotate_name(CpRotate r);  // "allgather", "alltoall" (torchtitan's spelling)
CpRotate cp_rotate_from_name(const std::string& s, const std::string& where);

struct ParallelLayout {
  int tensor_parallel = 1;             // t: ranks splitting each linear (and the attention heads)
  bool sequence_parallel = false;      // norms, dropouts and residuals split over the sequence by t
  bool async_tensor_parallel = false;  // TP's collectives overlapped with the GEMMs beside them
  int pipeline_parallel = 1;           // p: stages
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int virtual_stages = 1;                     // v: model chunks per stage (interleaved only)
  int micro_batches = 1;                      // m: micro-batches per pipeline per optimizer step
  int context_parallel = 1;                   // c: ranks splitting each sequence (ring attention)
  CpRotate cp_rotate = CpRotate::all_gather;  // torch's ring (hf, torchtitan) only
  // The embeddings and the head counted as this many blocks when the blocks are split over the
  // p·v model parts (torchtitan's pipeline_parallel_first/last_stage_less_layers, 1 by default
  // there; Megatron's --account-for-embedding/loss-in-pipeline-split count each as 1). 0, 0
  // with layers dividing p·v: the even split.
  int first_stage_less_layers = 0;
  int last_stage_less_layers = 0;

  int model_parallel() const { return tensor_parallel * pipeline_parallel * context_parallel; }
  // d = world / (t·p·c); 0 when it does not divide.
  int data_parallel(int world) const {
    const int mp = model_parallel();
    return mp > 0 && world % mp == 0 ? world / mp : 0;
  }
  // t = p = c = 1: plain data parallelism, evaluated by the step simulator as before.
  bool trivial() const { return model_parallel() == 1; }
};

// Blocks of each of the p·v model parts, in model order (part k runs on stage k mod p as its
// chunk k / p), as torchtitan splits them (distributed/pipeline_parallel.py,
// _generate_llm_fqn_per_model_part): L + first + last "effective layers" over the parts, the
// first (L + first + last) mod (p·v) parts one more, then the first part gives up `first` of its
// share to the embeddings and the last `last` to the head. Assumes layout_problems found none.
std::vector<std::int64_t> pipeline_parts(const ParallelLayout& l, std::int64_t layers);
// The split a recipe makes where the job does not say (p > 1): torchtitan counts the embeddings
// and the head as one block each (config/configs.py, pipeline_parallel_first/last_stage_less_layers
// default 1); Megatron-LM and the others split the blocks alone.
void apply_recipe_split(ParallelLayout& l, Recipe r);

// Stage s's blocks (all its chunks), and the model index of its first chunk's first block.
std::int64_t stage_blocks(const ParallelLayout& l, std::int64_t layers, int s);
std::int64_t stage_first_block(const ParallelLayout& l, std::int64_t layers, int s);

// Why the layout cannot run this model and job on this cluster, one reason per problem, each with
// the numbers (empty: it can). Never throws.
std::vector<std::string> layout_problems(const ParallelLayout& l, const ModelSpec& m,
                                         const TrainingJob& j, const Cluster& c);

// {"tensor_parallel": 2, "sequence_parallel": true, "pipeline_parallel": 4, "schedule": "1f1b",
//  "virtual_stages": 1, "micro_batches": 8, "context_parallel": 1, "async_tensor_parallel": false};
// every key optional (defaults above). Throws InputError naming the pointer and the value.
ParallelLayout layout_from_json(const nlohmann::json& j, const std::string& pointer);
nlohmann::json layout_to_json(const ParallelLayout& l);

}  // namespace shardplan::documents
