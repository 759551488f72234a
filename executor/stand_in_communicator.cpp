#include "executor/stand_in_communicator.hpp"
#include "kernels/memory_source.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace shardplan::executor {

using kernels::MemorySource;
namespace {

// A buffer in the rehearsal's memory (for the loss's all-reduce and full_parameters).
class SourceBuffer final : public comm::CommBuffer {
public:
  SourceBuffer(MemorySource& memory, std::size_t bytes)
      : memory_(memory), bytes_(bytes),
        data_(bytes ? memory.allocate(static_cast<std::int64_t>(bytes), true) : nullptr) {}
  ~SourceBuffer() override {
    if (data_) memory_.free(data_, static_cast<std::int64_t>(bytes_));
  }
  void* data() override { return data_; }
  std::size_t bytes() const override { return bytes_; }
  void do_copy_from_host(const void* source, std::size_t bytes, std::size_t offset) override {
    memory_.write(static_cast<unsigned char*>(data_) + offset, source,
                  static_cast<std::int64_t>(bytes));
  }
  void do_copy_to_host(void* destination, std::size_t bytes, std::size_t offset) const override {
    memory_.read(destination, static_cast<const unsigned char*>(data_) + offset,
                 static_cast<std::int64_t>(bytes));
  }

private:
  MemorySource& memory_;
  std::size_t bytes_;
  void* data_;
};

}  // namespace

StandInCommunicator::StandInCommunicator(int rank, int size, MemorySource* memory)
    : rank_(rank), size_(size), memory_(memory ? memory : &heap_) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument(fmt::format("rehearsal rank {} of {} ranks", rank, size));
}

void StandInCommunicator::copy(const void* send, void* recv, std::size_t bytes) {
  if (send != recv && bytes > 0) memory_->copy(recv, send, static_cast<std::int64_t>(bytes));
}

std::unique_ptr<comm::CommBuffer> StandInCommunicator::allocate(std::size_t bytes) {
  return std::make_unique<SourceBuffer>(*memory_, bytes);
}

void StandInCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count,
                                        comm::DataType type, comm::ReduceOp) {
  copy(send, recv, count * comm::element_bytes(type));
}

void StandInCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                    comm::DataType type, int root, comm::ReduceOp) {
  if (rank_ == root) copy(send, recv, count * comm::element_bytes(type));
}

void StandInCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                     comm::DataType type) {
  const std::size_t block = count * comm::element_bytes(type);
  auto* out = static_cast<unsigned char*>(recv);
  const unsigned char* mine = out + static_cast<std::size_t>(rank_) * block;
  copy(send, out + static_cast<std::size_t>(rank_) * block, block);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) copy(mine, out + static_cast<std::size_t>(r) * block, block);
}

void StandInCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                            comm::DataType type, comm::ReduceOp) {
  const std::size_t block = count * comm::element_bytes(type);
  copy(static_cast<const unsigned char*>(send) + static_cast<std::size_t>(rank_) * block, recv,
       block);
}

void StandInCommunicator::broadcast(void*, std::size_t, comm::DataType, int) {}

void StandInCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                     comm::DataType type) {
  copy(send, recv, count * comm::element_bytes(type) * static_cast<std::size_t>(size_));
}

std::unique_ptr<comm::Communicator> StandInCommunicator::split(int, int) {
  return std::make_unique<StandInCommunicator>(0, 1, memory_);
}

}  // namespace shardplan::executor
