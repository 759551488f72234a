// Initial parameters of a unit, defined element by element so that any rank can fill just its
// shard of a unit (the same values whatever the world size) without building the whole unit.
//
// Rules (GPT-2 as in HF GPT2PreTrainedModel._init_weights with initializer_range 0.02, and
// Radford et al. 2019 §2.3 / nanoGPT for the residual projections):
//   matrices (embeddings, linear weights)  ~ N(0, 0.02²)
//   residual output projections (attention output, MLP down)  ~ N(0, (0.02 / √(2·layers))²)
//   norm weights = 1, biases = 0
// Random numbers: element e of unit u under seed s draws two uniforms from splitmix64 (Steele et
// al. 2014) of a key mixing (s, u, e), and one Box–Muller normal; portable and order-free.
#pragma once

#include <cstdint>
#include <span>

#include "executor/model_layout.hpp"

namespace shardplan::executor {

// Fills out[i] with the initial value of element (begin + i) of unit `unit` (0 the embedding,
// 1..layers the blocks, layers + 1 the head). Elements at or past the unit's size (padding of a
// sharded flat buffer) are set to 0.
template <class S>
void init_unit_params(const GptLayout& layout, std::int64_t unit, std::uint64_t seed,
                      std::int64_t begin, std::span<S> out);

// splitmix64's output function (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
// generators"; the constants of java.util.SplittableRandom).
std::uint64_t splitmix64(std::uint64_t x);

}  // namespace shardplan::executor
