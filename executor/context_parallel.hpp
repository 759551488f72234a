// Context parallelism: c ranks share each sequence of S tokens, every other part of the model
// running on a rank's own S/c tokens, the attention exchanging keys and values around the ring
// of the c ranks (ring attention: Liu et al. 2023, "Ring Attention with Blockwise Transformers").
//
// The split is the load-balanced one of causal attention (Megatron-core's get_batch_on_this_cp_rank
// in megatron/training/utils.py; Transformer Engine's context-parallel attention): the sequence is
// cut into 2c chunks of S/(2c) tokens and rank r holds chunks r and 2c − 1 − r, so that every rank
// has as many query-key pairs under the causal mask. Positions in the sequence (rotary angles,
// the causal mask) are the tokens' places in the whole sequence.
//
// Ring attention (context_parallel_block.cpp), on the fused kernels only
// (flash_attention_host.hpp's forward_at and backward_at):
//   forward   c steps; at step i the rank attends its queries to the keys and values of rank
//             r − i (its own at i = 0), folding each block into a running softmax (an fp32 output
//             [N, q] and the log-sum-exp), and passes the keys and values it holds to rank r + 1
//             while receiving rank r − i − 1's from rank r − 1 (Communicator::send_recv)
//   backward  the same ring, each rank's dK and dV travelling with its K and V: at step i the rank
//             adds its queries' contributions to the dK, dV of rank r − i's keys and passes both
//             on; after the c-th step one more hop brings every rank its own dK and dV
// The exchanges are not overlapped with the attention's compute (each send_recv completes before
// the next block).
//
// The gradients of everything else are partial over the rank's tokens: they are averaged over the
// data-parallel and context-parallel ranks together (Megatron-core reduces gradients over its
// "dp-cp" group), the loss of each rank being the mean over its S/c tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace shardplan::executor {

struct ContextParallel {
  comm::Communicator* group = nullptr;  // the c ranks sharing each sequence (not owned); nullptr: 1
  int size() const { return group != nullptr ? group->size() : 1; }
  int rank() const { return group != nullptr ? group->rank() : 0; }
  bool active() const { return size() > 1; }
};

// The places in a sequence of `sequence` tokens of the sequence / c tokens rank r of c holds, in
// the order it holds them: chunk r, then chunk 2c − 1 − r. Throws std::invalid_argument unless 2c
// divides the sequence and 0 ≤ r < c.
std::vector<std::int32_t> context_positions(std::int64_t sequence, int c, int r);

// Rank r's share of each of `batch` sequences of `sequence` tokens: whole [batch, sequence] →
// share [batch, sequence / c], the tokens at context_positions(sequence, c, r) in that order.
void take_context_share(const std::int32_t* whole, std::int32_t* share, std::int64_t batch,
                        std::int64_t sequence, int c, int r);

// The ranks of a mesh (dp, cp, tp) with tensor parallelism innermost (documents/parallel.hpp's
// order): world rank w = (dp·c + cp)·t + tp. `context`: the c ranks with the same dp and tp;
// `data`: the d·c ranks with the same tp (the group gradients are averaged over), ordered by w, so
// that its rank is dp·c + cp. Collective over world; throws std::invalid_argument unless c·t
// divides the world.
struct ContextParallelGroups {
  std::unique_ptr<comm::Communicator> context, data;
};
ContextParallelGroups make_context_parallel_groups(comm::Communicator& world, int c, int t);

}  // namespace shardplan::executor
