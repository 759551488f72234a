#include "comm/watched_communicator.hpp"

namespace shardplan::comm {
namespace {

// begin_wait ... end_wait around one call, also when it throws.
class Waiting {
public:
  Waiting(Watchdog& watchdog, const char* operation) : watchdog_(watchdog) {
    watchdog_.begin_wait(operation);
  }
  ~Waiting() { watchdog_.end_wait(); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

private:
  Watchdog& watchdog_;
};

}  // namespace

WatchedCommunicator::WatchedCommunicator(Communicator& inner, Watchdog& watchdog)
    : ForwardingCommunicator(inner), watchdog_(watchdog), registration_(watchdog, inner) {}

WatchedCommunicator::WatchedCommunicator(std::unique_ptr<Communicator> inner, Watchdog& watchdog)
    : ForwardingCommunicator(*inner), owned_(std::move(inner)), watchdog_(watchdog),
      registration_(watchdog, *owned_) {}

void WatchedCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count,
                                        DataType type, ReduceOp op) {
  Waiting w(watchdog_, "all_reduce");
  inner_.all_reduce(send, recv, count, type, op);
}

void WatchedCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                    int root, ReduceOp op) {
  Waiting w(watchdog_, "reduce");
  inner_.reduce(send, recv, count, type, root, op);
}

void WatchedCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                     DataType type) {
  Waiting w(watchdog_, "all_gather");
  inner_.all_gather(send, recv, count, type);
}

void WatchedCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                            DataType type, ReduceOp op) {
  Waiting w(watchdog_, "reduce_scatter");
  inner_.reduce_scatter(send, recv, count, type, op);
}

void WatchedCommunicator::broadcast(void* buffer, std::size_t count, DataType type, int root) {
  Waiting w(watchdog_, "broadcast");
  inner_.broadcast(buffer, count, type, root);
}

void WatchedCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                     DataType type) {
  Waiting w(watchdog_, "all_to_all");
  inner_.all_to_all(send, recv, count, type);
}

void WatchedCommunicator::do_send(const void* buffer, std::size_t count, DataType type, int peer) {
  Waiting w(watchdog_, "send");
  inner_.send(buffer, count, type, peer);
}

void WatchedCommunicator::do_recv(void* buffer, std::size_t count, DataType type, int peer) {
  Waiting w(watchdog_, "recv");
  inner_.recv(buffer, count, type, peer);
}

void WatchedCommunicator::do_send_recv(const void* send_buffer, std::size_t send_count,
                                       int send_peer, void* recv_buffer, std::size_t recv_count,
                                       int recv_peer, DataType type) {
  Waiting w(watchdog_, "send_recv");
  inner_.send_recv(send_buffer, send_count, send_peer, recv_buffer, recv_count, recv_peer, type);
}

void WatchedCommunicator::barrier() {
  Waiting w(watchdog_, "barrier");
  inner_.barrier();
}

void WatchedCommunicator::synchronize() {
  Waiting w(watchdog_, "synchronize");
  inner_.synchronize();
}

std::unique_ptr<Communicator> WatchedCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> part;
  {
    Waiting w(watchdog_, "split");
    part = inner_.split(color, key);
  }
  return std::make_unique<WatchedCommunicator>(std::move(part), watchdog_);
}

}  // namespace shardplan::comm
