// Synthetic training tokens from a seeded generator. Sequence b of a batch is T + 1 draws of
// std::mt19937_64 (whose output sequence the C++ standard fixes, [rand.predef]) seeded with
// `seed`, each reduced modulo the vocabulary (a bias of at most V/2⁶⁴, nothing for a test of
// throughput and equivalence); inputs are its first T tokens, targets the last T (next-token
// prediction). The same seed gives the same batch on every platform and every rank.
#pragma once

#include <cstdint>

#include "executor/gpt_model.hpp"
#include "executor/tracked_allocator.hpp"

namespace shardplan::executor {

struct TokenBatch {
  BatchShape shape;
  TrackedBuffer<std::int32_t> inputs;   // [B, T]
  TrackedBuffer<std::int32_t> targets;  // [B, T]  inputs shifted left by one
};

// Allocated as `activations` (they are the batch's input tensors). Throws std::invalid_argument
// for an empty shape or a vocabulary outside [1, 2³¹).
TokenBatch synthetic_batch(TrackedAllocator& allocator, std::uint64_t seed, BatchShape shape,
                           std::int64_t vocab);

// Sequences first_sequence, first_sequence + 1, ... of one endless seeded stream: sequence i is
// drawn as above from its own generator, seeded with splitmix64(seed ^ splitmix64(i)), so any
// rank can make exactly the sequences of its micro-batch, and the same global batch split over any
// number of ranks and micro-batches holds the same sequences. Allocated as `activations`.
// share: under context parallelism (context_parallel.hpp), rank `rank` of `ranks` gets its share
// of each sequence: shape.seq is then the share's length, the sequences drawn ranks × as long.
struct ContextShare {
  int ranks = 1, rank = 0;
};
TokenBatch synthetic_sequences(TrackedAllocator& allocator, std::uint64_t seed,
                               std::int64_t first_sequence, BatchShape shape, std::int64_t vocab,
                               ContextShare share = {});

}  // namespace shardplan::executor
