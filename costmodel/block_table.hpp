// Each recipe's transformer block as data: the tensors its forward keeps for backward, in the
// order its ops run, each with its bytes per micro-batch, where tensor parallelism puts it, and
// whether the MLP's backward releases it before the attention's. One table per model code
// (block_table: the frameworks' per-op code by architecture, Korthikanti et al.'s Megatron-core
// GPT, the executor's GPT); one rule splits any of them over a rank's tensor-parallel group
// (RankSplit), one applies the job's checkpointing (rank_block). The 1D walk is t = 1 of the same
// rule.
#pragma once

#include <vector>

#include "costmodel/accounting.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"

namespace shardplan::costmodel {

// Tokens and widths of one micro-batch, as doubles: s the sequence, T = s·b tokens, h the hidden
// width, q and kv the query and key/value widths, a heads, I the MLP's width, V the vocabulary,
// hd the head dimension.
struct Shape {
  double s, T, h, q, kv, a, I, V, hd;
  Shape(const documents::ModelSpec& m, const documents::TrainingJob& j);
};

// The dtypes a forward keeps its tensors in: e bytes of the compute dtype; p of the parameters the
// block reads; r of the residual stream, which carries the embedding's output dtype, the
// parameters' (fp32 under autocast, since an embedding lookup is not autocast; the compute dtype
// when FSDP or DeepSpeed hand the block 16-bit parameters). Under autocast (p > e) each GEMM casts
// its own input to the compute dtype and that cast is what its backward keeps; otherwise GEMMs
// reading one tensor share it.
struct Dtypes {
  double e, p, r;
  bool cuda;
  explicit Dtypes(const Forward& f) : e(f.e), p(f.p), r(f.p), cuda(f.cuda) {}
  bool autocast() const { return p > e; }
  // What `consumers` GEMMs reading one norm output of dtype `out` keep.
  double gemm_inputs(int consumers, double out) const { return autocast() ? consumers * e : out; }
};

// Where a saved tensor lives on the ranks of a tensor-parallel group (Shoeybi et al. 2019, §3;
// Korthikanti et al. 2022, §4):
//   residual      on the residual stream's tokens (the norms' inputs and statistics, dropout
//                 masks): whole on every rank, split along the sequence under sequence parallelism
//   linear_input  a norm's output as the column-parallel linears after it keep it: Megatron-core
//                 keeps its sequence shard and gathers it again in backward; PyTorch's styles
//                 keep the all-gathered tensor (PrepareModuleInput: Shard(1) -> Replicate)
//   heads         between the column- and row-parallel linears (q, k, v, the attention core, the
//                 MLP's inner tensors): split over the heads and the intermediate width
enum class Placement { residual, linear_input, heads };

struct SavedTensor {
  const char* op;      // the module or op whose backward reads it
  const char* tensor;  // which tensor
  double bytes;        // per micro-batch, the whole block's (before tensor parallelism)
  Placement place;
  // Released by the MLP's backward (with the norm before it), which runs before the attention's
  // (false throughout for a parallel residual, whose two branches autograd orders by itself).
  bool mlp = false;
  bool core = false;  // eager attention's scores (what Megatron's selective recompute reruns)
};

struct BlockTable {
  std::vector<SavedTensor> saved;  // in the order the forward makes them
  double input = 0;                // the block's input, what a checkpointed block keeps
  // What the MLP's backward holds at its largest beyond the saved tensors, once only the down
  // projection has its weight's gradient (per-op code; 0 where not derived).
  double mlp_backward = 0;
};

// The block of the job's recipe, model and dtypes.
BlockTable block_table(const documents::ModelSpec& m, const documents::TrainingJob& j,
                       const Forward& f);

// How one rank of t holds each placement: `heads` by t; `residual` by sp (t under sequence
// parallelism, else 1); `linear_input` by sp where the shard is kept (Megatron-core), whole where
// the gathered tensor is (PyTorch's styles).
struct RankSplit {
  double t = 1;
  double sp = 1;
  bool gathered_linear_inputs = false;
  double of(Placement p) const;
};

// A table's bytes on one rank: every row, the eager scores', the rows the MLP's backward releases
// first; and one placement's bytes on the whole block.
double rank_bytes(const BlockTable& b, const RankSplit& r);
double rank_core_bytes(const BlockTable& b, const RankSplit& r);
double rank_mlp_bytes(const BlockTable& b, const RankSplit& r);
double placement_bytes(const BlockTable& b, Placement p);

// One block on one rank under the job's checkpointing: `checkpointed` (full, or its turn under
// every:N) keeps the rank's share of the input and rebuilds the rest; Megatron's selective
// recompute of eager attention drops the scores; torchtitan's op-level save list keeps its
// matmuls' outputs (selective_op.hpp, selective_op_saved) and rebuilds the rest beside them;
// otherwise every row.
ActivationBytes rank_block(const BlockTable& b, const documents::ModelSpec& m,
                           const documents::TrainingJob& j, const Forward& f, const RankSplit& r,
                           bool checkpointed);

// Whether transformers hands sdpa an explicit mask (a sliding window the keys reach).
bool sdpa_gets_mask(const documents::ModelSpec& m, const documents::TrainingJob& j);

// One norm's saved bytes: what it keeps on the token stream it runs on (its input, statistics,
// normalized value) and its output as the linears after it keep it (per consumer under autocast).
struct NormParts {
  double state = 0;
  double output = 0;
  double total() const { return state + output; }
};
// The head's final norm (Megatron's recipe: its input and the output layer's input).
NormParts final_norm_parts(const documents::ModelSpec& m, const documents::TrainingJob& j,
                           const Forward& f);

}  // namespace shardplan::costmodel
