// A collective stream on the host (comm/host_stream.hpp) over a communicator that records what
// it runs: collectives run on the stream's thread in the order they were issued, the caller does
// not wait for them, tickets order the caller and other streams after them, and a failure reaches
// whoever waits.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/host_buffer.hpp"
#include "comm/host_stream.hpp"
#include "idle_communicator.hpp"

using namespace shardplan::comm;

namespace {

// One rank alone: an all-reduce appends its count to a shared log (after `delay`, or throws when
// the count is 0), so order and concurrency are visible.
class LoggingCommunicator final : public test::IdleCommunicator {
public:
  LoggingCommunicator(std::vector<int>& log, std::mutex& m, std::chrono::milliseconds delay = {})
      : log_(log), mutex_(m), delay_(delay) {}

private:
  void do_all_reduce(const void*, void*, std::size_t count, DataType, ReduceOp) override {
    std::this_thread::sleep_for(delay_);
    if (count == 0) throw std::runtime_error("an all-reduce failed");
    std::lock_guard lock(mutex_);
    log_.push_back(static_cast<int>(count));
  }

  std::vector<int>& log_;
  std::mutex& mutex_;
  std::chrono::milliseconds delay_;
};

std::vector<int> snapshot(std::vector<int>& log, std::mutex& m) {
  std::lock_guard lock(m);
  return log;
}

}  // namespace

TEST_CASE("host_stream::collectives run in issue order on the stream, and the caller goes on") {
  std::vector<int> log;
  std::mutex m;
  LoggingCommunicator inner(log, m, std::chrono::milliseconds(50));
  StreamedCommunicator stream(inner);
  CHECK(stream.host_stream() == &stream);
  for (int i = 1; i <= 5; ++i)
    stream.all_reduce(nullptr, nullptr, static_cast<std::size_t>(i), DataType::f32);
  // Five collectives of 50 ms each: the calls returned before the last could have run.
  CHECK(stream.queued() == 5);
  CHECK(stream.done() < 5);
  stream.wait_for(2);
  CHECK(stream.done() >= 2);
  stream.synchronize();
  CHECK(stream.done() == 5);
  CHECK(snapshot(log, m) == std::vector<int>{1, 2, 3, 4, 5});
}

TEST_CASE("host_stream::a stream waits for another's ticket before what it queues next") {
  std::vector<int> log;
  std::mutex m;
  LoggingCommunicator slow(log, m, std::chrono::milliseconds(50)), fast(log, m);
  StreamedCommunicator a(slow), b(fast);
  a.all_reduce(nullptr, nullptr, 1, DataType::f32);
  b.enqueue_wait(a, a.queued());
  b.all_reduce(nullptr, nullptr, 2, DataType::f32);
  b.synchronize();
  CHECK(snapshot(log, m) == std::vector<int>{1, 2});  // without the wait b's 2 would come first
  // A wait for a ticket already done queues nothing.
  const auto before = b.queued();
  b.enqueue_wait(a, a.queued());
  CHECK(b.queued() == before);
}

TEST_CASE("host_stream::a failed collective reaches every wait and refuses what follows") {
  std::vector<int> log;
  std::mutex m;
  LoggingCommunicator inner(log, m);
  StreamedCommunicator stream(inner);
  stream.all_reduce(nullptr, nullptr, 0, DataType::f32);  // fails
  CHECK_THROWS_WITH(stream.synchronize(), "an all-reduce failed");
  CHECK_THROWS_WITH(stream.all_reduce(nullptr, nullptr, 3, DataType::f32), "an all-reduce failed");
  CHECK(snapshot(log, m).empty());
}

TEST_CASE("host_stream::abort ends the waits and takes nothing more") {
  std::vector<int> log;
  std::mutex m;
  LoggingCommunicator inner(log, m, std::chrono::milliseconds(30));
  StreamedCommunicator stream(inner);
  for (int i = 1; i <= 20; ++i)
    stream.all_reduce(nullptr, nullptr, static_cast<std::size_t>(i), DataType::f32);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    stream.abort();
  });
  CHECK_THROWS(stream.wait_for(20));
  aborter.join();
  CHECK(snapshot(log, m).size() < 20);
  CHECK_THROWS(stream.all_reduce(nullptr, nullptr, 1, DataType::f32));
}
