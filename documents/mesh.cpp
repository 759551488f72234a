#include "documents/mesh.hpp"

#include <algorithm>
#include <stdexcept>

namespace shardplan::documents {
namespace {

int index(Dim d) { return static_cast<int>(d); }

bool in(std::initializer_list<Dim> dims, int k) {
  return std::any_of(dims.begin(), dims.end(), [k](Dim d) { return index(d) == k; });
}

}  // namespace

Mesh::Mesh(int pipeline, int replicate, int shard, int context, int tensor)
    : sizes_{pipeline, replicate, shard, context, tensor} {
  for (const int n : sizes_)
    if (n < 1) throw std::invalid_argument("a mesh dimension has fewer than 1 rank");
}

int Mesh::size() const {
  int n = 1;
  for (const int s : sizes_) n *= s;
  return n;
}

int Mesh::size(Dim d) const { return sizes_[static_cast<std::size_t>(index(d))]; }

int Mesh::stride(Dim d) const {
  int s = 1;
  for (int k = index(d) + 1; k < kDims; ++k) s *= sizes_[static_cast<std::size_t>(k)];
  return s;
}

int Mesh::coordinate(int rank, Dim d) const { return rank / stride(d) % size(d); }

Mesh::Split Mesh::split(int rank, std::initializer_list<Dim> dims) const {
  Split s;
  for (int k = 0; k < kDims; ++k) {
    const int n = sizes_[static_cast<std::size_t>(k)];
    const int c = coordinate(rank, static_cast<Dim>(k));
    int& part = in(dims, k) ? s.key : s.color;
    part = part * n + c;
  }
  return s;
}

int Mesh::group_size(std::initializer_list<Dim> dims) const {
  int n = 1;
  for (int k = 0; k < kDims; ++k)
    if (in(dims, k)) n *= sizes_[static_cast<std::size_t>(k)];
  return n;
}

int Mesh::ranks_per_node(std::initializer_list<Dim> dims, int gpus_per_node) const {
  int inner = kDims - 1;
  while (inner > 0 && !in(dims, inner)) --inner;
  const int s = stride(static_cast<Dim>(inner));
  if (gpus_per_node <= 0 || s >= gpus_per_node) return 1;
  return std::max(1, std::min(group_size(dims), gpus_per_node / s));
}

}  // namespace shardplan::documents
