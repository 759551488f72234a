#include "costmodel/selective_op.hpp"
#include "costmodel/block_table.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/recipe.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace shardplan::costmodel {

using documents::Architecture;
using documents::AttentionImpl;
using documents::ModelSpec;
using documents::recipe_traits;
using documents::TrainingJob;

namespace {

bool llama_family(const ModelSpec& m) {
  return m.architecture == Architecture::llama || m.architecture == Architecture::mistral ||
         m.architecture == Architecture::qwen2;
}

}  // namespace

bool selective_op_derived(const ModelSpec& m, const TrainingJob& j) {
  return recipe_traits(j.recipe).fused_qkv_complex_rope || llama_family(m);
}

std::vector<bool> selective_op_reruns(const std::vector<Matmul>& mms) {
  std::vector<bool> rerun;
  rerun.reserve(mms.size());
  int counted = 0;
  for (const auto& mm : mms) {
    if (mm.mm) ++counted;
    rerun.push_back(mm.mm && counted % 2 == 0);
  }
  return rerun;
}

// Under torchtitan's tensor parallelism its policy sees each rank's local ops, so each saved
// tensor is the rank's: a column-parallel linear's output and the attention's a/t heads split by
// t, a row-parallel linear's output whole ([T, h], its partial sum before the all-reduce or the
// reduce-scatter, which the policy does not save), the block's input split by sp under sequence
// parallelism (measured: tests/costmodel/data/oracle_tp_units.json).
double selective_op_saved(const ModelSpec& m, const TrainingJob& j, const Forward& f, double t,
                          double sp) {
  const Shape x(m, j);
  const double e = f.e;
  // The block's input; sdpa's output and its fp32 logsumexp per head and token, or eager
  // attention's two aten::bmm outputs (in the save list): the scores q·kᵀ and probabilities·v.
  const double attention = j.attention == AttentionImpl::eager ? e * x.a * x.s * x.T + e * x.T * x.q
                                                               : e * x.T * x.q + 4 * x.a * x.T;
  double saved = f.p * x.T * x.h / sp + attention / t;
  const auto mms = block_matmuls(m, j);
  const auto rerun = selective_op_reruns(mms);
  for (std::size_t i = 0; i < mms.size(); ++i) {
    if (rerun[i]) continue;
    // Compiled, AOTAutograd's partition keeps what the policy saves only where the backward
    // reads it: not the block's last linear's output, which only the residual sum takes
    // (torchtitan's w2; measured: tests/costmodel/data/oracle_float8_units.json).
    if (j.compile && i + 1 == mms.size()) continue;
    saved += e * x.T * static_cast<double>(mms[i].out) / (mms[i].row_parallel ? 1 : t);
  }
  // Compiled under rowwise Float8, the fp32 scale per token of the MLP's input ([T, 1]), which
  // the rerun w3 casts its input with (measured there too).
  if (j.compile && float8_whole_block(m, j)) saved += 4 * x.T / sp;
  // Compiled under sequence parallelism the reduce-scatters are graph ops, and the save list's
  // _c10d_functional.reduce_scatter_tensor (torchtitan/distributed/activation_checkpoint.py)
  // keeps the attention projection's scattered output [T/sp, h], the residual's other term that
  // the ffn norm's backward rebuilds its input from (the MLP's, which the backward does not read,
  // is dropped; measured: tests/costmodel/data/oracle_tp_units.json).
  if (j.compile && sp > 1) saved += e * x.T * x.h / sp;
  return saved;
}

}  // namespace shardplan::costmodel
