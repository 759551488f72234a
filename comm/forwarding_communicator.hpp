// A Communicator that forwards every call to another one: the base of the wrappers that add one
// thing to a group (a watchdog's waits, timing, a thread of its own, the stream-order checker,
// host staging), each of which overrides only what it changes.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace shardplan::comm {

class ForwardingCommunicator : public Communicator {
public:
  // `inner` is not owned and must outlive this object.
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  std::string library_version() const override { return inner_.library_version(); }
  MemorySpace memory_space() const override { return inner_.memory_space(); }
  void* stream_handle() const override { return inner_.stream_handle(); }
  HostStream* host_stream() override { return inner_.host_stream(); }
  std::unique_ptr<CommBuffer> allocate(std::size_t bytes) override {
    return inner_.allocate(bytes);
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) override {
    inner_.all_gather(send, recv, count, type);
  }
  void broadcast(void* buffer, std::size_t count, DataType type, int root) override {
    inner_.broadcast(buffer, count, type, root);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type) override {
    inner_.all_to_all(send, recv, count, type);
  }
  void barrier() override { inner_.barrier(); }
  void synchronize() override { inner_.synchronize(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return inner_.split(color, key);
  }
  void abort() override { inner_.abort(); }

protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                     ReduceOp op) override {
    inner_.all_reduce(send, recv, count, type, op);
  }
  void do_reduce(const void* send, void* recv, std::size_t count, DataType type, int root,
                 ReduceOp op) override {
    inner_.reduce(send, recv, count, type, root, op);
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op) override {
    inner_.reduce_scatter(send, recv, count, type, op);
  }
  void do_send(const void* buffer, std::size_t count, DataType type, int peer) override {
    inner_.send(buffer, count, type, peer);
  }
  void do_recv(void* buffer, std::size_t count, DataType type, int peer) override {
    inner_.recv(buffer, count, type, peer);
  }
  void do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                    void* recv_buffer, std::size_t recv_count, int recv_peer,
                    DataType type) override {
    inner_.send_recv(send_buffer, send_count, send_peer, recv_buffer, recv_count, recv_peer, type);
  }

  Communicator& inner_;
};

}  // namespace shardplan::comm
