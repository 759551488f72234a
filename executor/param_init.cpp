#include "executor/param_init.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace shardplan::executor {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

namespace {

constexpr double kInitStd = 0.02;  // HF initializer_range default

// A standard normal for element `e` under `key`, by Box–Muller from two 53-bit uniforms.
double normal_at(std::uint64_t key, std::int64_t e) {
  const auto i = static_cast<std::uint64_t>(e);
  // 53-bit uniforms: u1 in (0, 1] (its log is finite), u2 in [0, 1).
  const double u1 = (static_cast<double>(splitmix64(key ^ (2 * i)) >> 11) + 1.0) * 0x1p-53;
  const double u2 = static_cast<double>(splitmix64(key ^ (2 * i + 1)) >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

template <class S>
void init_unit_params(const GptLayout& layout, std::int64_t unit, std::uint64_t seed,
                      std::int64_t begin, std::span<S> out) {
  const UnitKind kind = layout.unit_kind(unit);
  const std::int64_t size = layout.unit_size(kind);
  const auto& slots = layout.slots(kind);
  const auto& block = layout.block();
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(layout.spec().layers));
  const std::uint64_t key = splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(unit));

  std::size_t slot = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t e = begin + static_cast<std::int64_t>(i);
    if (e >= size) {
      out[i] = S(0);
      continue;
    }
    // Slots are sorted by offset; find the one holding e (usually the current one).
    while (slot + 1 < slots.size() && slots[slot + 1].offset <= e) ++slot;
    while (slot > 0 && slots[slot].offset > e) --slot;
    const TensorSlot& s = slots[slot];
    double value;
    if (s.tensor.is_matrix()) {
      const bool residual =
          kind == UnitKind::block && (s.offset == block.o.weight || s.offset == block.down.weight);
      value = (residual ? residual_std : kInitStd) * normal_at(key, e);
    } else {
      value = ends_with(s.tensor.name, ".bias") ? 0.0 : 1.0;
    }
    out[i] = static_cast<S>(value);
  }
}

template void init_unit_params<float>(const GptLayout&, std::int64_t, std::uint64_t, std::int64_t,
                                      std::span<float>);
template void init_unit_params<double>(const GptLayout&, std::int64_t, std::uint64_t, std::int64_t,
                                       std::span<double>);

}  // namespace shardplan::executor
