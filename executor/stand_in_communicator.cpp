#include "executor/stand_in_communicator.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace shardplan::executor {
namespace {

class HostBuffer final : public comm::CommBuffer {
public:
  explicit HostBuffer(std::size_t bytes) : data_(bytes) {}
  void* data() override { return data_.data(); }
  std::size_t bytes() const override { return data_.size(); }
  void copy_from_host(const void* source, std::size_t bytes, std::size_t offset) override {
    std::memcpy(data_.data() + offset, source, bytes);
  }
  void copy_to_host(void* destination, std::size_t bytes, std::size_t offset) const override {
    std::memcpy(destination, data_.data() + offset, bytes);
  }

private:
  std::vector<unsigned char> data_;
};

void copy_if_distinct(const void* send, void* recv, std::size_t bytes) {
  if (send != recv && bytes > 0)
    std::memmove(recv, send, bytes);
}

} // namespace

StandInCommunicator::StandInCommunicator(int rank, int size) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument(fmt::format("rehearsal rank {} of {} ranks", rank, size));
}

std::unique_ptr<comm::CommBuffer> StandInCommunicator::allocate(std::size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

void StandInCommunicator::all_reduce(const void* send, void* recv, std::size_t count,
                                     comm::DataType type, comm::ReduceOp) {
  copy_if_distinct(send, recv, count * comm::element_bytes(type));
}

void StandInCommunicator::reduce(const void* send, void* recv, std::size_t count,
                                 comm::DataType type, int root, comm::ReduceOp) {
  if (rank_ == root)
    copy_if_distinct(send, recv, count * comm::element_bytes(type));
}

void StandInCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                     comm::DataType type) {
  const std::size_t block = count * comm::element_bytes(type);
  auto* out = static_cast<unsigned char*>(recv);
  const unsigned char* mine = out + static_cast<std::size_t>(rank_) * block;
  copy_if_distinct(send, out + static_cast<std::size_t>(rank_) * block, block);
  for (int r = 0; r < size_; ++r)
    if (r != rank_)
      std::memcpy(out + static_cast<std::size_t>(r) * block, mine, block);
}

void StandInCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count,
                                         comm::DataType type, comm::ReduceOp) {
  const std::size_t block = count * comm::element_bytes(type);
  std::memcpy(recv,
              static_cast<const unsigned char*>(send) + static_cast<std::size_t>(rank_) * block,
              block);
}

void StandInCommunicator::broadcast(void*, std::size_t, comm::DataType, int) {}

void StandInCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                     comm::DataType type) {
  copy_if_distinct(send, recv, count * comm::element_bytes(type) * static_cast<std::size_t>(size_));
}

std::unique_ptr<comm::Communicator> StandInCommunicator::split(int, int) {
  return std::make_unique<StandInCommunicator>(0, 1);
}

} // namespace shardplan::executor
