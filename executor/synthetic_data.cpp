#include "executor/synthetic_data.hpp"

#include "executor/context_parallel.hpp"

#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "executor/param_init.hpp"

namespace shardplan::executor {

TokenBatch synthetic_batch(TrackedAllocator& allocator, std::uint64_t seed, BatchShape shape,
                           std::int64_t vocab) {
  if (shape.batch < 1 || shape.seq < 1)
    throw std::invalid_argument(
        fmt::format("synthetic batch of {} × {} tokens is empty", shape.batch, shape.seq));
  if (vocab < 1 || vocab > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument(fmt::format("vocabulary of {} tokens", vocab));
  TokenBatch batch;
  batch.shape = shape;
  batch.inputs = allocator.allocate<std::int32_t>(MemoryCategory::activations, shape.tokens());
  batch.targets = allocator.allocate<std::int32_t>(MemoryCategory::activations, shape.tokens());
  std::mt19937_64 generator(seed);
  const auto v = static_cast<std::uint64_t>(vocab);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    auto previous = static_cast<std::int32_t>(generator() % v);
    for (std::int64_t t = 0; t < shape.seq; ++t) {
      const auto next = static_cast<std::int32_t>(generator() % v);
      batch.inputs[b * shape.seq + t] = previous;
      batch.targets[b * shape.seq + t] = next;
      previous = next;
    }
  }
  return batch;
}

TokenBatch synthetic_sequences(TrackedAllocator& allocator, std::uint64_t seed,
                               std::int64_t first_sequence, BatchShape shape, std::int64_t vocab,
                               ContextShare share) {
  if (shape.batch < 1 || shape.seq < 1)
    throw std::invalid_argument(
        fmt::format("synthetic batch of {} × {} tokens is empty", shape.batch, shape.seq));
  if (vocab < 1 || vocab > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument(fmt::format("vocabulary of {} tokens", vocab));
  if (first_sequence < 0)
    throw std::invalid_argument(fmt::format("sequence index {} < 0", first_sequence));
  // Drawn on the host, then written into the allocator's memory (a GPU's, for the CUDA backend).
  const std::int64_t seq = shape.seq * share.ranks;  // the whole sequences'
  const auto count = static_cast<std::size_t>(shape.batch * seq);
  std::vector<std::int32_t> inputs(count), targets(count);
  const auto v = static_cast<std::uint64_t>(vocab);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const auto index = static_cast<std::uint64_t>(first_sequence + b);
    std::mt19937_64 generator(splitmix64(seed ^ splitmix64(index)));
    auto previous = static_cast<std::int32_t>(generator() % v);
    for (std::int64_t t = 0; t < seq; ++t) {
      const auto next = static_cast<std::int32_t>(generator() % v);
      const auto at = static_cast<std::size_t>(b * seq + t);
      inputs[at] = previous;
      targets[at] = next;
      previous = next;
    }
  }
  if (share.ranks > 1) {
    for (auto* whole : {&inputs, &targets}) {
      std::vector<std::int32_t> mine(static_cast<std::size_t>(shape.tokens()));
      take_context_share(whole->data(), mine.data(), shape.batch, seq, share.ranks, share.rank);
      *whole = std::move(mine);
    }
  }
  TokenBatch batch;
  batch.shape = shape;
  batch.inputs =
      allocator.allocate_uninitialized<std::int32_t>(MemoryCategory::activations, shape.tokens());
  batch.targets =
      allocator.allocate_uninitialized<std::int32_t>(MemoryCategory::activations, shape.tokens());
  const auto bytes = static_cast<std::int64_t>(inputs.size() * sizeof(std::int32_t));
  allocator.source().write(batch.inputs.data(), inputs.data(), bytes);
  allocator.source().write(batch.targets.data(), targets.data(), bytes);
  return batch;
}

}  // namespace shardplan::executor
