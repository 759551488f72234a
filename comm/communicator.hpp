// One interface for the collectives of a group of ranks, whatever carries them (MPI on CPU
// buffers, NCCL on GPU buffers). Every call is collective over the group unless it says otherwise;
// every failure is a CommError. Counts are in elements of `type`.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/data_type.hpp"

namespace shardplan::comm {

class HostStream;  // comm/host_stream.hpp

enum class MemorySpace { host, device };

// Memory that a communicator's collectives read and write: host memory for MPI, the rank's GPU
// for NCCL. Copies to and from host memory are complete when they return; they do not wait for
// queued collectives (call Communicator::synchronize() first).
class CommBuffer {
public:
  CommBuffer() = default;
  CommBuffer(const CommBuffer&) = delete;
  CommBuffer& operator=(const CommBuffer&) = delete;
  virtual ~CommBuffer() = default;

  virtual void* data() = 0;
  virtual std::size_t bytes() const = 0;
  // Copies `bytes` between host memory and this buffer at `offset` bytes into it.
  void copy_from_host(const void* source, std::size_t bytes, std::size_t offset = 0) {
    do_copy_from_host(source, bytes, offset);
  }
  void copy_to_host(void* destination, std::size_t bytes, std::size_t offset = 0) const {
    do_copy_to_host(destination, bytes, offset);
  }

protected:
  // What copy_from_host and copy_to_host do (the public calls carry the default offset; a virtual
  // function takes every argument).
  virtual void do_copy_from_host(const void* source, std::size_t bytes, std::size_t offset) = 0;
  virtual void do_copy_to_host(void* destination, std::size_t bytes, std::size_t offset) const = 0;
};

class Communicator {
public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // in this group, 0 ≤ rank < size
  virtual int size() const = 0;
  virtual const char* backend() const = 0;          // "mpi", "nccl"
  virtual std::string library_version() const = 0;  // "Open MPI v4.1.4", "NCCL 2.21.5"
  virtual MemorySpace memory_space() const = 0;
  // The stream this group's collectives are queued on, an opaque handle the backend that orders
  // compute against them understands: a cudaStream_t for NCCL (events order it), the communicator
  // itself under the stream-order checker (executor/stream_check.hpp). nullptr for a backend whose
  // collectives complete before returning.
  virtual void* stream_handle() const { return nullptr; }
  // The host thread this group's collectives run on, for a backend that computes on the host
  // (comm/host_stream.hpp); nullptr when they run on the calling thread (or on a device stream).
  virtual HostStream* host_stream() { return nullptr; }
  // Not collective: memory this communicator's collectives can use.
  virtual std::unique_ptr<CommBuffer> allocate(std::size_t bytes) = 0;

  // recv[i] = op over ranks of send[i], on every rank. send == recv reduces in place.
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                  ReduceOp op = ReduceOp::sum) {
    do_all_reduce(send, recv, count, type, op);
  }
  // Like all_reduce, but only `root` receives; recv is not touched on other ranks.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, int root,
              ReduceOp op = ReduceOp::sum) {
    do_reduce(send, recv, count, type, root, op);
  }
  // Each rank sends `count` elements; recv (size()·count) holds rank r's at offset r·count.
  // In place when send == recv + rank()·count.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DataType type) = 0;
  // send holds size() blocks of `count`; rank r receives the reduction of every rank's block r.
  // send and recv must not overlap.
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                      ReduceOp op = ReduceOp::sum) {
    do_reduce_scatter(send, recv, count, type, op);
  }
  // root's buffer (count elements) is copied to every rank's buffer.
  virtual void broadcast(void* buffer, std::size_t count, DataType type, int root) = 0;
  // send holds size() blocks of `count`; block p goes to rank p, which stores it at block rank().
  // send and recv must not overlap.
  virtual void all_to_all(const void* send, void* recv, std::size_t count, DataType type) = 0;
  virtual void barrier() = 0;
  // Point-to-point, not collective: `count` elements to or from `peer`, a rank of this group other
  // than this one; the peer makes the matching call with this rank (messages between two ranks
  // arrive in the order they were sent). Blocking: send returns once `buffer` may be reused, recv
  // once it holds the message (on NCCL: once queued on the stream, as every collective; call
  // synchronize() before reading it on the host). Throws CommError for a bad peer.
  void send(const void* buffer, std::size_t count, DataType type, int peer) {
    check_peer(peer, "send");
    do_send(buffer, count, type, peer);
  }
  void recv(void* buffer, std::size_t count, DataType type, int peer) {
    check_peer(peer, "recv");
    do_recv(buffer, count, type, peer);
  }
  // Both at once with the same peer, which calls send_recv, or send and recv in either order:
  // the exchange two pipeline stages make when each sends the other a tensor (an activation one
  // way, a gradient the other), where two blocking sends would wait on each other.
  void send_recv(const void* send_buffer, std::size_t send_count, void* recv_buffer,
                 std::size_t recv_count, DataType type, int peer) {
    check_peer(peer, "send_recv");
    do_send_recv(send_buffer, send_count, peer, recv_buffer, recv_count, peer, type);
  }
  // Both at once with two peers: to `send_peer` and from `recv_peer` (MPI_Sendrecv; NCCL's
  // grouped send and recv). Stages in a ring (an interleaved pipeline's last stage feeding the
  // first stage's next model chunk) each send on while receiving, where blocking sends around
  // the ring would wait on each other.
  void send_recv(const void* send_buffer, std::size_t send_count, int send_peer, void* recv_buffer,
                 std::size_t recv_count, int recv_peer, DataType type) {
    check_peer(send_peer, "send_recv");
    check_peer(recv_peer, "send_recv");
    do_send_recv(send_buffer, send_count, send_peer, recv_buffer, recv_count, recv_peer, type);
  }
  // Waits until every collective this rank has issued has completed (NCCL queues them on a
  // stream; MPI's calls are already complete when they return).
  virtual void synchronize() = 0;
  // The ranks that pass the same `color` form a new communicator, ordered by `key`, then by rank
  // in this one. Collective over this communicator; every rank gets its own group.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Not collective; callable from any thread, once this rank gives up on the group (a peer failed
  // or stopped, comm/watchdog.hpp): what the rank has queued on the group stops instead of waiting
  // for ever, and the group is unusable afterwards. NCCL aborts its communicator (ncclCommAbort).
  // A backend whose calls block the calling thread (MPI) cannot cancel a started collective: it
  // has nothing to do here, and its rank ends with the job (MpiEnvironment::abort, MPI_Abort).
  virtual void abort() {}

protected:
  // What all_reduce, reduce and reduce_scatter do: the public calls carry the default operation,
  // a virtual function takes every argument (a default on a virtual function is the caller's
  // static type's, not the override's).
  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                             ReduceOp op) = 0;
  virtual void do_reduce(const void* send, void* recv, std::size_t count, DataType type, int root,
                         ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op) = 0;
  // What send and recv do once the peer is checked.
  virtual void do_send(const void* buffer, std::size_t count, DataType type, int peer) = 0;
  virtual void do_recv(void* buffer, std::size_t count, DataType type, int peer) = 0;
  virtual void do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                            void* recv_buffer, std::size_t recv_count, int recv_peer,
                            DataType type) = 0;

private:
  // Throws CommError unless 0 <= peer < size() and peer != rank().
  void check_peer(int peer, const char* call) const;
};

}  // namespace shardplan::comm
