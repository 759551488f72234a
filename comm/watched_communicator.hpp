// A Communicator that tells a Watchdog about every call that waits for the other ranks (the
// collectives, barrier, synchronize, split) and forwards it to another communicator. The groups it
// splits off are watched too, so a program wraps its world once and the engine's shard and replica
// groups report their collectives as well.
#pragma once

#include <memory>
#include <string>

#include "comm/forwarding_communicator.hpp"
#include "comm/watchdog.hpp"

namespace shardplan::comm {

class WatchedCommunicator final : public ForwardingCommunicator {
public:
  // Neither `inner` nor `watchdog` is owned; both must outlive this object.
  WatchedCommunicator(Communicator& inner, Watchdog& watchdog);
  // Owns `inner` (a group split off a watched communicator).
  WatchedCommunicator(std::unique_ptr<Communicator> inner, Watchdog& watchdog);

  void do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                     ReduceOp op) override;
  void do_reduce(const void* send, void* recv, std::size_t count, DataType type, int root,
                 ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op) override;
  void broadcast(void* buffer, std::size_t count, DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type) override;
  void do_send(const void* buffer, std::size_t count, DataType type, int peer) override;
  void do_recv(void* buffer, std::size_t count, DataType type, int peer) override;
  void do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                    void* recv_buffer, std::size_t recv_count, int recv_peer,
                    DataType type) override;
  void barrier() override;
  void synchronize() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

private:
  std::unique_ptr<Communicator> owned_;
  Watchdog& watchdog_;
  Watchdog::Watched registration_;  // aborted with the job
};

}  // namespace shardplan::comm
