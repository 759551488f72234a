// Collectives that run beside the computing thread on the host: each StreamedCommunicator is one
// stream, a worker thread that runs its group's collectives one after another in the order they
// were issued, while the thread that issued them goes on computing. This is a CUDA stream's
// contract (the engine's, kernels/backend.hpp) on CPUs: a call queues the collective and returns;
// HostStream's tickets stand for CUDA events (a ticket is "the first n collectives of the stream
// are done"), and the host backend orders compute against the streams with them.
//
// MPI must be initialized with MPI_THREAD_MULTIPLE (comm/mpi_environment.hpp): each stream's
// worker calls MPI on its own communicator while the main thread calls it on others. Every rank
// issues each group's collectives in the same order, so the workers of one group meet.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/forwarding_communicator.hpp"

namespace shardplan::comm {

class HostStream {
public:
  virtual ~HostStream() = default;
  // The ticket of everything queued so far.
  virtual std::uint64_t queued() const = 0;
  // The ticket of everything done so far (done <= queued).
  virtual std::uint64_t done() const = 0;
  // Blocks until the first `ticket` collectives are done; rethrows the first one that failed.
  virtual void wait_for(std::uint64_t ticket) = 0;
  // What this stream runs from now on starts after `other`'s first `ticket` collectives.
  virtual void enqueue_wait(HostStream& other, std::uint64_t ticket) = 0;
};

class StreamedCommunicator final : public ForwardingCommunicator, public HostStream {
public:
  // `inner` (not owned) must outlive this and is used only by the worker while it is.
  explicit StreamedCommunicator(Communicator& inner);
  // Runs what is queued, then ends the thread (a failure is dropped: the owner synchronizes first
  // to see it).
  ~StreamedCommunicator() override;

  HostStream* host_stream() override { return this; }

  // Queued; each returns at once.
  void do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                     ReduceOp op) override;
  void do_reduce(const void* send, void* recv, std::size_t count, DataType type, int root,
                 ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op) override;
  void broadcast(void* buffer, std::size_t count, DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type) override;
  // After everything queued is done, on the calling thread (blocking, as the interface says).
  void do_send(const void* buffer, std::size_t count, DataType type, int peer) override;
  void do_recv(void* buffer, std::size_t count, DataType type, int peer) override;
  void do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                    void* recv_buffer, std::size_t recv_count, int recv_peer,
                    DataType type) override;
  // After everything queued is done.
  void barrier() override;
  void synchronize() override { wait_for(queued()); }
  // After everything queued is done; the new group is not streamed.
  std::unique_ptr<Communicator> split(int color, int key) override;
  // The worker takes nothing more; waits end with an error. (What the inner communicator has
  // started is the inner's to stop: comm/watchdog.hpp.)
  void abort() override;

  std::uint64_t queued() const override;
  std::uint64_t done() const override;
  void wait_for(std::uint64_t ticket) override;
  void enqueue_wait(HostStream& other, std::uint64_t ticket) override;

private:
  void enqueue(std::function<void()> task);
  void run();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  std::uint64_t queued_ = 0, done_ = 0;
  std::exception_ptr error_;  // the first failure; what follows it is skipped
  bool stopping_ = false;     // the owner is going, or abort(): nothing more is taken
  bool aborted_ = false;
  std::thread worker_;  // last: started once the rest is ready
};

}  // namespace shardplan::comm
