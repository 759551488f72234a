// A block's linears as rows, in the order its forward calls them: the one list its GEMMs' time
// (compute_time.cpp, unit_work and block_recompute), torchtitan's op-level save list
// (selective_op.cpp) and tensor parallelism's split of each GEMM read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "documents/job.hpp"
#include "documents/model.hpp"

namespace shardplan::costmodel {

// y[T, out] = x[T, in]·Wᵀ. row_parallel: split along `in` under tensor parallelism (the
// attention's output projection and the MLP's down projection, which write the residual width;
// the others are column-parallel, split along `out`). mm: it runs as aten::mm (no bias) rather
// than aten::addmm. fp8: the job's Float8 recipe converts it (its GEMMs run on fp8 operands).
// name: its module path inside the block, as the recipe's code names it.
struct Matmul {
  std::string name;
  std::int64_t out = 0, in = 0;
  bool row_parallel = false;
  bool mm = true;
  bool fp8 = false;
};

// The linears the recipe's block code calls (its RecipeTraits::linears). torchtitan runs its own
// Llama block (models/llama3, torchtitan 0.3.0) whatever model the job names: one fused wqkv, wo,
// then the FeedForward's w2(silu(w1(x)) * w3(x)), bias-free; Megatron-core its TransformerLayer's
// four. The others call the model's own linears in the order the model lists them
// (documents/model.cpp follows each architecture's forward: transformers' Llama q, k, v, o, gate,
// up, down; GPT-2's c_attn, c_proj, c_fc, c_proj; GPT-NeoX's query_key_value, dense, dense_h_to_4h,
// dense_4h_to_h; MPT's Wqkv, out_proj, up_proj, down_proj).
std::vector<Matmul> block_matmuls(const documents::ModelSpec& m, const documents::TrainingJob& j);

// torchtitan's Float8LinearConverter (torchtitan 0.3.0, components/quantization/float8.py and
// utils.py, module_filter_fn) converts a linear whose in and out sizes are multiples of 16 and
// whose fully qualified name ("layers.3.attention.wo", "lm_head") contains none of the job's
// float8_filter entries. float8_converts applies it to one linear; head_float8 to the head's
// projection ("lm_head"); float8_filter_per_layer names the first filter entry that converts a
// block's linear in some blocks and not in others (the cost model's blocks are alike), or "".
bool float8_converts(const documents::TrainingJob& j, const std::string& fqn, std::int64_t out,
                     std::int64_t in);
// Whether the job's Float8 converts every linear of the block (what the compiled block's measured
// partition assumes).
bool float8_whole_block(const documents::ModelSpec& m, const documents::TrainingJob& j);
bool head_float8(const documents::ModelSpec& m, const documents::TrainingJob& j);
std::string float8_filter_per_layer(const documents::ModelSpec& m, const documents::TrainingJob& j);

}  // namespace shardplan::costmodel
