#include "executor/tensor_parallel.hpp"

#include "documents/mesh.hpp"
#include "executor/param_init.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace shardplan::executor {
namespace {

// How a block tensor at `offset` of the full layout is split: column-parallel weights and biases
// by rows (out features), row-parallel weights by columns (in features), the rest replicated.
enum class Split { rows, cols, none };

Split split_of(const BlockLayout& L, std::int64_t offset, bool is_bias) {
  // A fused query_key_value starts at q's offset: it is column-parallel as a whole.
  for (const LinearOffsets* c : {&L.q, &L.k, &L.v, &L.up, &L.gate})
    if (offset != kAbsent && offset == (is_bias ? c->bias : c->weight)) return Split::rows;
  if (!is_bias && (offset == L.o.weight || offset == L.down.weight)) return Split::cols;
  return Split::none;
}

void add_column(std::vector<Segment>& s, const LinearOffsets& full, const LinearOffsets& local,
                int r) {
  if (full.weight == kAbsent) return;
  s.push_back({full.weight + r * local.out * full.in, local.weight, local.out * full.in});
  if (full.bias != kAbsent) s.push_back({full.bias + r * local.out, local.bias, local.out});
}

void add_row(std::vector<Segment>& s, const LinearOffsets& full, const LinearOffsets& local,
             int r) {
  for (std::int64_t i = 0; i < full.out; ++i)
    s.push_back({full.weight + i * full.in + r * local.in, local.weight + i * local.in, local.in});
  if (full.bias != kAbsent) s.push_back({full.bias, local.bias, full.out});
}

void add_norm(std::vector<Segment>& s, const NormOffsets& full, const NormOffsets& local,
              std::int64_t h) {
  s.push_back({full.weight, local.weight, h});
  if (full.bias != kAbsent) s.push_back({full.bias, local.bias, h});
}

}  // namespace

void check_tensor_parallel(const documents::ModelSpec& m, int t) {
  if (t < 1) throw std::invalid_argument(fmt::format("tensor-parallel size {} is not >= 1", t));
  auto check = [&](std::int64_t n, const char* what) {
    if (n % t != 0)
      throw std::invalid_argument(
          fmt::format("tensor-parallel size {} does not divide the {} {}", t, n, what));
  };
  check(m.heads, "attention heads");
  check(m.kv_heads, "key/value heads");
  check(m.intermediate, "MLP intermediate columns");
  // Megatron pads the vocabulary to a multiple of t × make-vocab-size-divisible-by
  // (megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding); padded rows would add
  // logits to the softmax, and the run would no longer be data parallelism's: refused instead.
  if (m.vocab % t != 0)
    throw std::invalid_argument(fmt::format(
        "tensor-parallel size {} does not divide the vocabulary of {} tokens (the embedding and "
        "the head are vocabulary-parallel: give a vocabulary that is a multiple of {})",
        t, m.vocab, t));
}

documents::ModelSpec local_spec(const documents::ModelSpec& full, int t) {
  check_tensor_parallel(full, t);
  const GptLayout layout(full);
  documents::ModelSpec m = full;
  m.heads /= t;
  m.kv_heads /= t;
  m.intermediate /= t;
  m.vocab /= t;
  // Vocabulary-parallel: the token table and the untied output matrix [V, h] by rows.
  auto split_rows = [&](documents::UnitTensors& unit, UnitKind kind, std::int64_t offset) {
    for (const auto& slot : layout.slots(kind))
      if (offset != kAbsent && slot.offset == offset)
        for (auto& x : unit.tensors)
          if (x.name == slot.tensor.name) x.rows /= t;
  };
  split_rows(m.embedding, UnitKind::embedding, layout.embedding().tokens);
  split_rows(m.head, UnitKind::head, layout.head().output);
  for (const auto& slot : layout.slots(UnitKind::block)) {
    const bool is_bias = slot.tensor.rows == 1 && slot.tensor.name.ends_with(".bias");
    const auto it =
        std::find_if(m.block.tensors.begin(), m.block.tensors.end(),
                     [&](const documents::Tensor& x) { return x.name == slot.tensor.name; });
    switch (split_of(layout.block(), slot.offset, is_bias)) {
    case Split::rows:
      if (is_bias)
        it->cols /= t;
      else
        it->rows /= t;
      break;
    case Split::cols:
      it->cols /= t;
      break;
    case Split::none:
      break;
    }
  }
  return m;
}

std::vector<Segment> slice_segments(const GptLayout& full, const GptLayout& local, UnitKind kind,
                                    int t, int r) {
  if (t == 1) return {{0, 0, full.unit_size(kind)}};
  const std::int64_t rows = local.spec().vocab * full.spec().hidden;  // one vocabulary shard
  if (kind == UnitKind::embedding) {
    const EmbeddingLayout& F = full.embedding();
    const EmbeddingLayout& L = local.embedding();
    std::vector<Segment> s{{F.tokens + r * rows, L.tokens, rows}};
    if (F.positions != kAbsent)
      s.push_back({F.positions, L.positions, full.spec().max_positions * full.spec().hidden});
    return s;
  }
  if (kind == UnitKind::head) {
    const HeadLayout& F = full.head();
    const HeadLayout& L = local.head();
    std::vector<Segment> s;
    add_norm(s, F.norm, L.norm, full.spec().hidden);
    if (F.output != kAbsent) s.push_back({F.output + r * rows, L.output, rows});
    return s;
  }
  const BlockLayout& F = full.block();
  const BlockLayout& L = local.block();
  const std::int64_t h = full.spec().hidden;
  std::vector<Segment> s;
  add_norm(s, F.norm1, L.norm1, h);
  add_norm(s, F.norm2, L.norm2, h);
  const std::pair<const LinearOffsets*, const LinearOffsets*> columns[] = {
      {&F.q, &L.q}, {&F.k, &L.k}, {&F.v, &L.v}, {&F.up, &L.up}, {&F.gate, &L.gate}};
  for (const auto& c : columns) add_column(s, *c.first, *c.second, r);
  add_row(s, F.o, L.o, r);
  add_row(s, F.down, L.down, r);
  return s;
}

template <class T>
void slice_unit(std::span<const T> full_unit, std::span<T> local_unit,
                const std::vector<Segment>& segments) {
  for (const auto& s : segments)
    std::copy_n(full_unit.begin() + s.full, s.length, local_unit.begin() + s.local);
}

template void slice_unit<float>(std::span<const float>, std::span<float>,
                                const std::vector<Segment>&);
template void slice_unit<double>(std::span<const double>, std::span<double>,
                                 const std::vector<Segment>&);

std::vector<float> assemble_unit(const GptLayout& full, const GptLayout& local, std::int64_t unit,
                                 std::span<const float> gathered, int t) {
  const UnitKind kind = full.unit_kind(unit);
  const std::int64_t n = local.unit_size(kind);
  if (static_cast<std::int64_t>(gathered.size()) != n * t)
    throw std::invalid_argument(fmt::format("unit {}: {} gathered elements, expected {} × {}", unit,
                                            gathered.size(), t, n));
  std::vector<float> out(static_cast<std::size_t>(full.unit_size(kind)));
  for (int r = t - 1; r >= 0; --r)  // rank 0 last: its replicated tensors are the ones kept
    for (const auto& s : slice_segments(full, local, kind, t, r))
      std::copy_n(gathered.begin() + r * n + s.local, s.length, out.begin() + s.full);
  return out;
}

template <class A>
void init_local_params(const TensorParallel& tp, const GptLayout& local, std::int64_t unit,
                       std::uint64_t seed, std::int64_t begin, std::span<A> out) {
  const UnitKind kind = local.unit_kind(unit);
  std::vector<A> whole(static_cast<std::size_t>(tp.full->unit_size(kind)));
  init_unit_params<A>(*tp.full, unit, seed, 0, whole);
  std::vector<A> mine(static_cast<std::size_t>(local.unit_size(kind)));
  slice_unit<A>(whole, mine, slice_segments(*tp.full, local, kind, tp.size(), tp.rank()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto e = static_cast<std::size_t>(begin) + i;
    out[i] = e < mine.size() ? mine[e] : A(0);
  }
}

template void init_local_params<float>(const TensorParallel&, const GptLayout&, std::int64_t,
                                       std::uint64_t, std::int64_t, std::span<float>);
template void init_local_params<double>(const TensorParallel&, const GptLayout&, std::int64_t,
                                        std::uint64_t, std::int64_t, std::span<double>);

std::vector<float> gather_full_unit(const TensorParallel& tp, const GptLayout& local,
                                    std::int64_t unit, std::span<const float> mine) {
  if (!tp.active()) return {mine.begin(), mine.end()};
  const std::size_t n = mine.size(), t = static_cast<std::size_t>(tp.size());
  auto buffer = tp.group->allocate(n * t * sizeof(float));
  buffer->copy_from_host(mine.data(), n * sizeof(float),
                         n * static_cast<std::size_t>(tp.rank()) * sizeof(float));
  auto* base = static_cast<float*>(buffer->data());
  tp.group->all_gather(base + n * static_cast<std::size_t>(tp.rank()), base, n,
                       comm::DataType::f32);
  tp.group->synchronize();
  std::vector<float> all(n * t);
  buffer->copy_to_host(all.data(), all.size() * sizeof(float));
  return assemble_unit(*tp.full, local, unit, all, tp.size());
}

TensorParallelGroups make_tensor_parallel_groups(comm::Communicator& world, int t) {
  const int n = world.size(), r = world.rank();
  if (t < 1 || n % t != 0)
    throw std::invalid_argument(
        fmt::format("tensor-parallel size {} does not divide the {} ranks", t, n));
  using documents::Dim;
  const documents::Mesh m(1, 1, n / t, 1, t);  // documents/mesh.hpp
  const auto tp = m.split(r, {Dim::tensor});
  const auto dp = m.split(r, {Dim::shard});
  TensorParallelGroups g;
  g.tp = world.split(tp.color, tp.key);
  g.dp = world.split(dp.color, dp.key);
  return g;
}

}  // namespace shardplan::executor
