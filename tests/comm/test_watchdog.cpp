#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/fault_injection.hpp"
#include "comm/watchdog.hpp"
#include "idle_communicator.hpp"

using namespace shardplan::comm;
using namespace std::chrono_literals;

namespace {

// A watchdog whose lines go to a temporary file and whose end of the job is recorded instead.
struct Watched {
  std::FILE* lines = std::tmpfile();
  std::atomic<int> ended_with{-1};
  Watchdog watchdog;

  explicit Watched(double timeout_s)
      : watchdog({.program = "test",
                  .rank = 1,
                  .timeout_s = timeout_s,
                  .report_fd = fileno(lines),
                  .report_crashes = false},
                 [this](int code) { ended_with = code; }) {}
  ~Watched() { std::fclose(lines); }

  std::string text() {
    std::string all;
    std::rewind(lines);
    for (int c = std::fgetc(lines); c != EOF; c = std::fgetc(lines)) all += static_cast<char>(c);
    return all;
  }
  // Waits up to `limit` for the job to end; the exit code, or -1.
  int wait_for_end(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (ended_with == -1 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(10ms);
    return ended_with;
  }
};

}  // namespace

TEST_CASE("watchdog::no progress ends the job with one line naming the rank and the phase") {
  Watched w(0.2);
  w.watchdog.set_phase("step 2 forward unit 1");
  REQUIRE(w.wait_for_end(4000ms) == kTimeoutExitCode);
  const auto text = w.text();
  CHECK(text.find("test: rank 1 on ") == 0);
  CHECK(text.find(": no progress for 0.2 s in phase 'step 2 forward unit 1'; aborting the job\n") !=
        std::string::npos);
}

TEST_CASE("watchdog::progress keeps it quiet") {
  Watched w(0.3);
  for (int i = 0; i < 16; ++i) {
    w.watchdog.begin_wait("all_gather");
    std::this_thread::sleep_for(25ms);
    w.watchdog.end_wait();
    w.watchdog.set_phase("step " + std::to_string(i));
    std::this_thread::sleep_for(25ms);
  }
  CHECK(w.ended_with == -1);
  CHECK(w.text().empty());
  CHECK(w.watchdog.phase() == "step 15");
}

TEST_CASE(
    "watchdog::a rank waiting for the others gives them a short grace to name themselves first") {
  Watched w(0.2);
  CHECK(w.watchdog.grace_s() == 0.2);
  w.watchdog.set_phase("step 3 backward unit 2");
  w.watchdog.begin_wait("reduce_scatter");
  CHECK(w.watchdog.phase() == "step 3 backward unit 2: reduce_scatter");
  REQUIRE(w.wait_for_end(4000ms) == kTimeoutExitCode);
  CHECK(w.text().find("in phase 'step 3 backward unit 2: reduce_scatter' (waiting for the other "
                      "ranks); aborting the job") != std::string::npos);
}

TEST_CASE(
    "watchdog::overlapping waits (collective streams) keep the rank waiting until the last ends") {
  Watched w(60);
  w.watchdog.set_phase("step 1 backward unit 3");
  w.watchdog.begin_wait("all_gather");             // the all-gathers' stream
  w.watchdog.begin_wait("reduce_scatter");         // the reductions' stream
  w.watchdog.set_phase("step 1 backward unit 2");  // the computing thread goes on
  w.watchdog.end_wait();
  CHECK(w.watchdog.phase() == "step 1 backward unit 2: reduce_scatter");
  w.watchdog.end_wait();
  CHECK(w.watchdog.phase() == "step 1 backward unit 2");
}

TEST_CASE("watchdog::fires at its deadline, waiting or not") {
  // A 1 s timeout fires 1 s after the last progress, or 1.2 s while the rank waits for the
  // others: the limit the watchdog's thread waits for (a grace of 2 s once made --timeout-s 10
  // end the job after 12 s). How late a loaded machine wakes the thread is not the watchdog's:
  // the time taken is bounded below only.
  for (bool waiting : {false, true}) {
    CAPTURE(waiting);
    const auto start = std::chrono::steady_clock::now();
    Watched w(1.0);
    w.watchdog.set_phase("step 1");
    if (waiting) w.watchdog.begin_wait("all_gather");
    CHECK(w.watchdog.limit_s() == doctest::Approx(waiting ? 1.2 : 1.0));
    REQUIRE(w.wait_for_end(30000ms) == kTimeoutExitCode);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(took >= 1.0);
  }
}

TEST_CASE("watchdog::aborts the communicators it watches before the job ends") {
  struct Abortable final : test::IdleCommunicator {
    std::atomic<bool> aborted{false};
    void abort() override { aborted = true; }
  } group;
  Watched w(0.1);
  const auto watched = w.watchdog.watch(group);
  REQUIRE(w.wait_for_end(4000ms) == kTimeoutExitCode);
  CHECK(group.aborted);
}

TEST_CASE("watchdog::rejects a timeout that is not > 0 and finite") {
  for (double t : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(t);
    CHECK_THROWS_AS(
        Watchdog({.program = "test", .timeout_s = t, .report_crashes = false}, [](int) {}),
        std::invalid_argument);
  }
}

TEST_CASE("fault::an injected throw happens at its rank and step only and names itself") {
  Watched w(60);
  w.watchdog.set_phase("step 2");
  const auto fault = parse_fault_injection("throw@1:2");
  bool oom = false;
  const auto out_of_memory = [&] { oom = true; };
  inject_due_fault(fault, 0, 2, w.watchdog, out_of_memory);  // another rank
  inject_due_fault(fault, 1, 1, w.watchdog, out_of_memory);  // another step
  inject_due_fault(std::nullopt, 1, 2, w.watchdog, out_of_memory);
  CHECK(w.watchdog.phase() == "step 2");
  CHECK_THROWS_WITH_AS(inject_due_fault(fault, 1, 2, w.watchdog, out_of_memory), "injected failure",
                       std::runtime_error);
  CHECK(w.watchdog.phase() == "step 2 (injected throw)");
  inject_due_fault(parse_fault_injection("oom@1:2"), 1, 2, w.watchdog, out_of_memory);
  CHECK(oom);
}
