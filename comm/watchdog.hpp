// A watchdog for one rank of a job, so that no rank waits forever for one that crashed, hung or
// threw. The program tells it what the rank is doing (set_phase: "step 3 forward unit 5") and
// brackets every call that waits for other ranks (begin_wait/end_wait: "all_gather"); every such
// call is progress. A thread of its own checks that progress happens: after timeout_s without any,
// it writes one line naming the rank and the phase,
//
//   executor: rank 1 on node7: no progress for 300 s in phase 'step 2 (injected hang)'; aborting
//   the job
//
// aborts the communicators it watches (NCCL's ncclCommAbort: their queued kernels stop) and ends
// the job through the end_job function it was given (MPI_Abort) with kTimeoutExitCode.
//
// Who is to blame: a rank blocked in a collective waits for another rank, while a rank that stopped
// outside one is the culprit. The culprit's last progress came before the waiting ranks entered
// the collective that waits for it, so its watchdog fires first; a waiting rank gives it
// grace_s (0.2 s) more, for the scheduling jitter between the two, and no more: a rank that cannot
// name itself (stopped by a signal, or every rank waiting) must not keep the job past its timeout
// (a grace of 2 s made --timeout-s 10 end the job after 12 s). The job ends within
// timeout_s + grace_s of the last progress.
//
// While it lives it also reports crashes: on SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT it writes
//
//   executor: rank 1 on node7: crashed (SIGSEGV) in phase 'step 2 backward unit 3'
//
// with async-signal-safe calls, then lets the previous handler (Open MPI's backtrace) or the
// default action end the process; the launcher then ends the other ranks.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"

namespace shardplan::comm {

// The exit code of a job that a watchdog ended (0 done, 1 error, 2 bad input, 3 out of memory).
inline constexpr int kTimeoutExitCode = 4;
// How much longer than timeout_s a rank waiting for the others waits (see above).
inline constexpr double kWaitingGrace_s = 0.2;

class Watchdog {
public:
  struct Options {
    std::string program;     // the first word of every line: "executor", "calibrate"
    int rank = 0;            // world rank, named in every line
    double timeout_s = 300;  // > 0: no progress for this long ends the job
    int report_fd = 2;       // where the lines go (standard error)
    bool report_crashes = true;
  };
  // Ends the job with the exit code and does not return (MPI_Abort). Called from the watchdog's
  // thread when it fires, or from fail()/end_job() on the caller's.
  using EndJob = std::function<void(int exit_code)>;

  // Starts the thread; the phase is "startup" until the first set_phase. Only the first watchdog
  // alive at a time reports crashes (signal handlers are per process).
  Watchdog(Options options, EndJob end_job);
  // Stops watching (the thread ends) and restores the signal handlers.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Called by the threads that do the rank's work (the main one; with collective streams,
  // comm/host_stream.hpp, each stream's too). Both are progress and cost a short lock and a copy
  // of at most kPhaseCapacity bytes. `waits_for_peers`: the whole phase is spent in
  // calls that wait for the other ranks (a benchmark of collectives), as between begin_wait and
  // end_wait.
  void set_phase(std::string_view phase, bool waits_for_peers = false);
  // `operation` names the call ("all_gather") and must be a string literal: it is kept by pointer.
  void begin_wait(const char* operation);
  void end_wait();

  // "step 2 forward unit 1", with ": all_gather" while in a waiting call.
  std::string phase() const;
  double timeout_s() const { return options_.timeout_s; }
  double grace_s() const { return grace_s_; }
  // How long after the last progress the watchdog fires now: timeout_s, plus grace_s while the
  // rank waits for the others (its thread computes its deadline from this).
  double limit_s() const;

  // Communicators to abort (Communicator::abort) before the job ends, while the returned object
  // lives. Their abort must be callable from the watchdog's thread.
  class Watched {
  public:
    Watched(Watchdog& watchdog, Communicator& communicator);
    ~Watched();
    Watched(const Watched&) = delete;
    Watched& operator=(const Watched&) = delete;

  private:
    Watchdog& watchdog_;
    Communicator& communicator_;
  };
  Watched watch(Communicator& communicator) { return {*this, communicator}; }

  // For a rank that knows it failed: writes "<program>: rank R on H failed in phase 'P': <what>"
  // and ends the job with exit_code.
  [[noreturn]] void fail(std::string_view what, int exit_code);
  // Aborts the watched communicators and ends the job with exit_code, without a line (the caller
  // wrote its own).
  [[noreturn]] void end_job(int exit_code);

  static constexpr std::size_t kPhaseCapacity = 160;  // bytes kept of a phase, with its NUL

private:
  using Clock = std::chrono::steady_clock;
  friend struct CrashReport;

  void run();
  void progress_locked();  // mutex_ held
  void abort_watched();
  void write_line(std::string_view text) const;
  std::string phase_locked() const;
  double limit_locked() const;

  Options options_;
  EndJob end_job_;
  double grace_s_;
  // "executor: rank 1 on node7: ", made once: the crash handler cannot format.
  std::array<char, 128> prefix_{};

  mutable std::mutex mutex_;  // guards everything below; the crash handler reads without it
  std::condition_variable wake_;
  std::array<char, kPhaseCapacity> phase_{};
  const char* operation_ = nullptr;  // the waiting call begun last, or nullptr
  int waits_ = 0;                    // waiting calls under way (collective streams overlap them)
  bool phase_waits_ = false;
  Clock::time_point last_progress_;
  bool stopping_ = false;
  std::vector<Communicator*> watched_;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace shardplan::comm
