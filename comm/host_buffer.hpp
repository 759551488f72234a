// A CommBuffer in host memory (64-byte aligned), for communicators that work on CPU buffers.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/communicator.hpp"

namespace shardplan::comm {

class HostBuffer final : public CommBuffer {
public:
  explicit HostBuffer(std::size_t bytes);
  void* data() override { return storage_.get(); }
  std::size_t bytes() const override { return bytes_; }
  void do_copy_from_host(const void* source, std::size_t bytes, std::size_t offset) override;
  void do_copy_to_host(void* destination, std::size_t bytes, std::size_t offset) const override;

private:
  struct AlignedDelete {
    void operator()(std::byte* p) const;
  };
  std::size_t bytes_;
  std::unique_ptr<std::byte[], AlignedDelete> storage_;
};

}  // namespace shardplan::comm
