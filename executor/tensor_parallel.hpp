// Megatron-style tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", §3) with optional
// sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", §4.2.2), over a group of t ranks:
//
//   column-parallel  q, k, v (by query heads and key/value heads), MLP up and gate (by
//                    intermediate columns): rank r holds rows [r·out/t, (r+1)·out/t) of the
//                    weight [out, in] and of its bias
//   row-parallel     attention output projection, MLP down: rank r holds columns
//                    [r·in/t, (r+1)·in/t) of the weight [out, in]; the bias [out] is held whole
//                    on every rank and added once (by TP rank 0, before the reduction)
//   vocabulary-      the token table [V, h] and the untied output matrix [V, h]: rank r holds
//   parallel         rows [r·V/t, (r+1)·V/t) (megatron/core/tensor_parallel/layers.py,
//                    VocabParallelEmbedding; the output layer is a column-parallel linear); a tied
//                    head reads the same shard of the token table. The vocabulary must be a
//                    multiple of t (check_tensor_parallel).
//   replicated       the norms (the final one too) and GPT-2's learned position table: every rank
//                    of the group holds them whole and, seeing the same inputs and gradients,
//                    computes the same gradients
//
// Megatron's conjugate operators (megatron/core/tensor_parallel/mappings.py):
//   f  before a column-parallel linear: identity forward, all-reduce of the input gradient in the
//      backward (copy_to_tensor_model_parallel_region)
//   g  after a row-parallel linear: all-reduce of the output forward, identity backward
//      (reduce_from_tensor_model_parallel_region)
// With sequence parallelism the residual stream, the norms and the dropout-free residual adds run
// on a 1/t shard of the tokens: f becomes an all-gather of the tokens forward and a
// reduce-scatter backward (gather_from_sequence_parallel_region), g a reduce-scatter forward and
// an all-gather backward (reduce_scatter_to_sequence_parallel_region). Megatron shards its [s, b,
// h] activations along s; the executor's are [B·T, h] and it shards the B·T token rows into t
// contiguous blocks (the same as Megatron's for one sequence per micro-batch; the same bytes and
// communication volume for any B). A column-parallel linear keeps its input as the token shard
// and gathers it again for its weight gradient, as Megatron's
// LinearWithGradAccumulationAndAsyncCommunication does (megatron/core/tensor_parallel/layers.py).
// The norms' weight gradients are then partial sums over the token shards: they are all-reduced
// over the group (Megatron's allreduce of sequence-parallel layernorm gradients,
// megatron/core/distributed/finalize_model_grads.py).
//
// The embedding looks up the tokens of its shard (0 for the others) and its output is summed over
// the group: all-reduced, or reduce-scattered to this rank's tokens under sequence parallelism
// (VocabParallelEmbedding's reduce_from_tensor_model_parallel_region, or its
// reduce_scatter_embeddings). A learned position table is added by TP rank 0 before the sum (the
// other ranks add exact zeros, so the sum is Megatron's word embedding plus positions, added
// after its all-reduce). Its backward is the identity (all-gather of the tokens under sequence
// parallelism); each rank adds the rows of its own tokens. The head gathers its normed input
// (sequence parallelism), computes its logits [N, V/t] and the vocabulary-parallel cross-entropy
// (megatron/core/tensor_parallel/cross_entropy.py, vocab_parallel_cross_entropy): each row's
// maximum all-reduced (max) over the group, its Σ exp(z − max) all-reduced (sum), the
// log-probabilities of this rank's columns from those two, and the loss from the rank owning each
// target (the per-rank sums all-reduced). Its backward is softmax − one-hot on this rank's
// columns; the normed input's gradient is a partial sum over the vocabulary shards, all-reduced
// (reduce-scattered under sequence parallelism) as a column-parallel linear's input gradient.
//
// Each rank's model is the local model: the spec with heads, kv_heads and intermediate divided
// by t (local_spec), its units laid out by GptLayout as usual; slice_segments maps a local block
// onto the full block, so that parameter initialisation draws the same full model as t = 1 and
// slices it, and full parameters can be put back together.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "documents/model.hpp"
#include "executor/model_layout.hpp"

namespace shardplan::executor {

struct TensorParallel {
  comm::Communicator* group = nullptr;    // the t ranks (not owned); nullptr: t = 1
  bool sequence_parallel = false;         // norms and residual on 1/t of the tokens
  std::shared_ptr<const GptLayout> full;  // the whole model's layout (t > 1)
  int size() const { return group != nullptr ? group->size() : 1; }
  int rank() const { return group != nullptr ? group->rank() : 0; }
  bool active() const { return size() > 1; }
  // The whole model's vocabulary (the local model's is V/t).
  std::int64_t vocab(const documents::ModelSpec& local) const {
    return full != nullptr ? full->spec().vocab : local.vocab;
  }
};

// Throws std::invalid_argument unless t divides the query heads, the key/value heads, the
// intermediate width (Megatron's divisibility checks, megatron/core/transformer/attention.py) and
// the vocabulary (Megatron pads it instead; the executor does not, see tensor_parallel.cpp).
void check_tensor_parallel(const documents::ModelSpec& full, int t);
// The model one rank of t holds: heads/t, kv_heads/t, intermediate/t, vocab/t and every tensor
// sliced as above.
documents::ModelSpec local_spec(const documents::ModelSpec& full, int t);

// A run of `length` elements at `full` in the full unit and `local` in rank r's unit.
struct Segment {
  std::int64_t full = 0;
  std::int64_t local = 0;
  std::int64_t length = 0;
};
// Every element of rank r's unit of kind `kind` once, as runs of the full unit.
std::vector<Segment> slice_segments(const GptLayout& full, const GptLayout& local, UnitKind kind,
                                    int t, int r);

// Rank r's slice of the full unit's values.
template <class T>
void slice_unit(std::span<const T> full_unit, std::span<T> local_unit,
                const std::vector<Segment>& segments);

// The full unit from the t ranks' local units, concatenated in rank order (an all-gather over the
// group). Replicated tensors are taken from rank 0.
std::vector<float> assemble_unit(const GptLayout& full, const GptLayout& local, std::int64_t unit,
                                 std::span<const float> gathered, int t);

// Elements [begin, begin + out.size()) of this rank's unit under tp: the full unit's initial
// values (param_init.hpp), the same as at t = 1, sliced; 0 past the unit's size.
template <class A>
void init_local_params(const TensorParallel& tp, const GptLayout& local, std::int64_t unit,
                       std::uint64_t seed, std::int64_t begin, std::span<A> out);

// Collective over tp's group: the full unit from every rank's local unit `mine` (its whole
// parameters, e.g. ShardingEngine::full_parameters). mine itself when t = 1.
std::vector<float> gather_full_unit(const TensorParallel& tp, const GptLayout& local,
                                    std::int64_t unit, std::span<const float> mine);

// The tensor-parallel group of t consecutive ranks (the innermost dimension of the mesh,
// documents/parallel.hpp) and the data-parallel group of the ranks with the same TP rank.
// Collective over world; throws std::invalid_argument unless t divides the world.
struct TensorParallelGroups {
  std::unique_ptr<comm::Communicator> tp, dp;
};
TensorParallelGroups make_tensor_parallel_groups(comm::Communicator& world, int t);

}  // namespace shardplan::executor
