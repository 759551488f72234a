#include "comm/host_stream.hpp"

#include "comm/comm_error.hpp"

namespace shardplan::comm {

StreamedCommunicator::StreamedCommunicator(Communicator& inner)
    : ForwardingCommunicator(inner), worker_([this] { run(); }) {}

StreamedCommunicator::~StreamedCommunicator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;  // the worker runs what is queued (nothing after an abort), then ends
  }
  changed_.notify_all();
  worker_.join();
}

void StreamedCommunicator::run() {
  for (;;) {
    std::function<void()> task;
    bool skip = false;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      skip = error_ != nullptr;
    }
    std::exception_ptr failed;
    if (!skip) {
      try {
        task();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mutex_);
      if (failed && !error_) error_ = failed;
      ++done_;
    }
    changed_.notify_all();
  }
}

void StreamedCommunicator::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_)
      throw CommError("collective stream aborted (a rank failed or stopped)", __FILE__, __LINE__);
    if (error_) std::rethrow_exception(error_);
    tasks_.push_back(std::move(task));
    ++queued_;
  }
  changed_.notify_all();
}

std::uint64_t StreamedCommunicator::queued() const {
  std::lock_guard lock(mutex_);
  return queued_;
}

std::uint64_t StreamedCommunicator::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void StreamedCommunicator::wait_for(std::uint64_t ticket) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= ticket || error_ || aborted_; });
  if (error_) std::rethrow_exception(error_);
  if (done_ < ticket)
    throw CommError("collective stream aborted (a rank failed or stopped)", __FILE__, __LINE__);
}

void StreamedCommunicator::enqueue_wait(HostStream& other, std::uint64_t ticket) {
  if (&other == this || other.done() >= ticket) return;
  enqueue([&other, ticket] { other.wait_for(ticket); });
}

void StreamedCommunicator::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = stopping_ = true;
    tasks_.clear();
  }
  changed_.notify_all();
  inner_.abort();
}

void StreamedCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count,
                                         DataType type, ReduceOp op) {
  enqueue([=, this] { inner_.all_reduce(send, recv, count, type, op); });
}
void StreamedCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                     int root, ReduceOp op) {
  enqueue([=, this] { inner_.reduce(send, recv, count, type, root, op); });
}
void StreamedCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                      DataType type) {
  enqueue([=, this] { inner_.all_gather(send, recv, count, type); });
}
void StreamedCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                             DataType type, ReduceOp op) {
  enqueue([=, this] { inner_.reduce_scatter(send, recv, count, type, op); });
}
void StreamedCommunicator::broadcast(void* buffer, std::size_t count, DataType type, int root) {
  enqueue([=, this] { inner_.broadcast(buffer, count, type, root); });
}
void StreamedCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                      DataType type) {
  enqueue([=, this] { inner_.all_to_all(send, recv, count, type); });
}

void StreamedCommunicator::do_send(const void* buffer, std::size_t count, DataType type, int peer) {
  synchronize();
  inner_.send(buffer, count, type, peer);
}

void StreamedCommunicator::do_recv(void* buffer, std::size_t count, DataType type, int peer) {
  synchronize();
  inner_.recv(buffer, count, type, peer);
}

void StreamedCommunicator::do_send_recv(const void* send_buffer, std::size_t send_count,
                                        int send_peer, void* recv_buffer, std::size_t recv_count,
                                        int recv_peer, DataType type) {
  synchronize();
  inner_.send_recv(send_buffer, send_count, send_peer, recv_buffer, recv_count, recv_peer, type);
}

void StreamedCommunicator::barrier() {
  synchronize();
  inner_.barrier();
}

std::unique_ptr<Communicator> StreamedCommunicator::split(int color, int key) {
  synchronize();
  return inner_.split(color, key);
}

}  // namespace shardplan::comm
