#include "executor/timed_communicator.hpp"

#include <chrono>

namespace shardplan::executor {

template <class F>
void TimedCommunicator::timed(CollectiveKind kind, documents::Collective op, double size_bytes,
                              F&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  auto& tally = stats_[kind];
  ++tally.calls;
  tally.seconds += took.count();
  tally.size_bytes += size_bytes;
  tally.bytes_sent += documents::bytes_sent_per_rank(op, inner_.size(), size_bytes);
}

namespace {
double bytes_of(std::size_t count, comm::DataType type) {
  return static_cast<double>(count * comm::element_bytes(type));
}
}  // namespace

void TimedCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count,
                                      comm::DataType type, comm::ReduceOp op) {
  timed(CollectiveKind::all_reduce, documents::Collective::all_reduce, bytes_of(count, type),
        [&] { inner_.all_reduce(send, recv, count, type, op); });
}

void TimedCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                  comm::DataType type, int root, comm::ReduceOp op) {
  timed(CollectiveKind::other, documents::Collective::reduce, bytes_of(count, type),
        [&] { inner_.reduce(send, recv, count, type, root, op); });
}

void TimedCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                   comm::DataType type) {
  // nccl-tests size of an all-gather: the whole gathered buffer.
  timed(CollectiveKind::all_gather, documents::Collective::all_gather,
        bytes_of(count, type) * inner_.size(), [&] { inner_.all_gather(send, recv, count, type); });
}

void TimedCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                          comm::DataType type, comm::ReduceOp op) {
  // nccl-tests size of a reduce-scatter: the whole input buffer.
  timed(CollectiveKind::reduce_scatter, documents::Collective::reduce_scatter,
        bytes_of(count, type) * inner_.size(),
        [&] { inner_.reduce_scatter(send, recv, count, type, op); });
}

void TimedCommunicator::broadcast(void* buffer, std::size_t count, comm::DataType type, int root) {
  timed(CollectiveKind::other, documents::Collective::broadcast, bytes_of(count, type),
        [&] { inner_.broadcast(buffer, count, type, root); });
}

void TimedCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                   comm::DataType type) {
  timed(CollectiveKind::other, documents::Collective::all_to_all,
        bytes_of(count, type) * inner_.size(), [&] { inner_.all_to_all(send, recv, count, type); });
}

void TimedCommunicator::barrier() {
  timed(CollectiveKind::other, documents::Collective::all_reduce, 0, [&] { inner_.barrier(); });
}

}  // namespace shardplan::executor
