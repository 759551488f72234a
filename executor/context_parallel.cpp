#include "executor/context_parallel.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "documents/mesh.hpp"

namespace shardplan::executor {

std::vector<std::int32_t> context_positions(std::int64_t sequence, int c, int r) {
  const std::int64_t chunks = 2 * std::int64_t{c};
  if (c < 1 || r < 0 || r >= c || sequence < chunks || sequence % chunks != 0)
    throw std::invalid_argument(fmt::format(
        "a sequence of {} tokens does not split into 2 x {} chunks for rank {}", sequence, c, r));
  const std::int64_t chunk = sequence / chunks;
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(2 * chunk));
  for (const std::int64_t which : {std::int64_t{r}, chunks - 1 - r})
    for (std::int64_t i = 0; i < chunk; ++i)
      out.push_back(static_cast<std::int32_t>(which * chunk + i));
  return out;
}

void take_context_share(const std::int32_t* whole, std::int32_t* share, std::int64_t batch,
                        std::int64_t sequence, int c, int r) {
  const auto positions = context_positions(sequence, c, r);
  const auto local = static_cast<std::int64_t>(positions.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < local; ++i)
      share[b * local + i] = whole[b * sequence + positions[static_cast<std::size_t>(i)]];
}

ContextParallelGroups make_context_parallel_groups(comm::Communicator& world, int c, int t) {
  const int n = world.size(), w = world.rank();
  if (c < 1 || t < 1 || n % (c * t) != 0)
    throw std::invalid_argument(fmt::format(
        "context-parallel size {} × tensor-parallel size {} does not divide the {} ranks", c, t,
        n));
  // The ring: the c ranks at one data-parallel and tensor position; the gradients' group: the d·c
  // ranks at one tensor position (documents/mesh.hpp).
  const documents::Mesh m(1, 1, n / (c * t), c, t);
  using documents::Dim;
  const auto ring = m.split(w, {Dim::context});
  const auto data = m.split(w, {Dim::replicate, Dim::shard, Dim::context});
  ContextParallelGroups g;
  g.context = world.split(ring.color, ring.key);
  g.data = world.split(data.color, data.key);
  return g;
}

}  // namespace shardplan::executor
