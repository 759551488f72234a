#include "comm/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "comm/process_identity.hpp"

namespace shardplan::comm {
namespace {

// Copies `text` into buffer[at, capacity - 1) and returns the new end; never writes past it.
// Async-signal-safe (no allocation, no locale).
std::size_t append(char* buffer, std::size_t capacity, std::size_t at, const char* text) {
  while (*text != '\0' && at + 1 < capacity) buffer[at++] = *text++;
  return at;
}

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written <= 0) return;  // nothing better to do with a broken standard error
    data += written;
    size -= static_cast<std::size_t>(written);
  }
}

const char* signal_name(int signal) {
  switch (signal) {
  case SIGSEGV:
    return "SIGSEGV";
  case SIGBUS:
    return "SIGBUS";
  case SIGFPE:
    return "SIGFPE";
  case SIGILL:
    return "SIGILL";
  case SIGABRT:
    return "SIGABRT";
  }
  return "a fatal signal";
}

}  // namespace

// The process-wide half of crash reporting: signal handlers can only reach a watchdog through
// static state. One watchdog at a time reports; the handlers it replaced are kept to run after it.
struct CrashReport {
  static constexpr std::array<int, 5> kSignals = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  static inline std::atomic<Watchdog*> reporter{nullptr};
  static inline std::array<struct sigaction, kSignals.size()> previous{};

  static bool install(Watchdog* watchdog) {
    Watchdog* none = nullptr;
    if (!reporter.compare_exchange_strong(none, watchdog)) return false;
    struct sigaction action {};
    action.sa_handler = handle;
    sigemptyset(&action.sa_mask);
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &previous[i]);
    return true;
  }

  static void uninstall(Watchdog* watchdog) {
    if (reporter.load() != watchdog) return;
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous[i], nullptr);
    reporter.store(nullptr);
  }

  // Reads the phase without the lock: the crash may have happened while the main thread held it,
  // and at worst the line shows a phase being rewritten.
  static void handle(int signal) {
    if (const Watchdog* w = reporter.load()) {
      std::array<char, 512> line{};
      std::size_t n = append(line.data(), line.size(), 0, w->prefix_.data());
      n = append(line.data(), line.size(), n, "crashed (");
      n = append(line.data(), line.size(), n, signal_name(signal));
      n = append(line.data(), line.size(), n, ") in phase '");
      n = append(line.data(), line.size(), n, w->phase_.data());
      if (const char* operation = w->operation_) {
        n = append(line.data(), line.size(), n, ": ");
        n = append(line.data(), line.size(), n, operation);
      }
      n = append(line.data(), line.size() - 1, n, "'");
      line[n++] = '\n';
      write_all(w->options_.report_fd, line.data(), n);
    }
    // The replaced action (Open MPI prints a backtrace, the default ends the process) runs when
    // this handler returns: the signal stays blocked until then.
    for (std::size_t i = 0; i < kSignals.size(); ++i)
      if (kSignals[i] == signal) sigaction(signal, &previous[i], nullptr);
    raise(signal);
  }
};

Watchdog::Watchdog(Options options, EndJob end_job)
    : options_(std::move(options)), end_job_(std::move(end_job)), grace_s_(kWaitingGrace_s) {
  if (!(options_.timeout_s > 0) || !std::isfinite(options_.timeout_s))
    throw std::invalid_argument(
        fmt::format("the watchdog's timeout must be > 0 and finite, got {}", options_.timeout_s));
  const auto prefix =
      fmt::format("{}: rank {} on {}: ", options_.program, options_.rank, host_name());
  std::strncpy(prefix_.data(), prefix.c_str(), prefix_.size() - 1);
  set_phase("startup");
  if (options_.report_crashes) CrashReport::install(this);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  CrashReport::uninstall(this);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::progress_locked() { last_progress_ = Clock::now(); }

void Watchdog::set_phase(std::string_view phase, bool waits_for_peers) {
  std::lock_guard lock(mutex_);
  const std::size_t n = std::min(phase.size(), phase_.size() - 1);
  std::memcpy(phase_.data(), phase.data(), n);
  phase_[n] = '\0';
  phase_waits_ = waits_for_peers;
  progress_locked();
}

void Watchdog::begin_wait(const char* operation) {
  std::lock_guard lock(mutex_);
  ++waits_;
  operation_ = operation;
  progress_locked();
}

void Watchdog::end_wait() {
  std::lock_guard lock(mutex_);
  if (waits_ > 0 && --waits_ == 0) operation_ = nullptr;
  progress_locked();
}

std::string Watchdog::phase_locked() const {
  std::string text(phase_.data());
  if (operation_ != nullptr) text += fmt::format(": {}", operation_);
  return text;
}

std::string Watchdog::phase() const {
  std::lock_guard lock(mutex_);
  return phase_locked();
}

Watchdog::Watched::Watched(Watchdog& watchdog, Communicator& communicator)
    : watchdog_(watchdog), communicator_(communicator) {
  std::lock_guard lock(watchdog_.mutex_);
  watchdog_.watched_.push_back(&communicator_);
}

Watchdog::Watched::~Watched() {
  std::lock_guard lock(watchdog_.mutex_);
  auto& list = watchdog_.watched_;
  list.erase(std::find(list.begin(), list.end(), &communicator_));
}

void Watchdog::write_line(std::string_view text) const {
  const std::string line = fmt::format("{}{}\n", prefix_.data(), text);
  write_all(options_.report_fd, line.data(), line.size());
}

void Watchdog::abort_watched() {
  std::vector<Communicator*> list;
  {
    std::lock_guard lock(mutex_);
    list = watched_;
  }
  // The most recent first: groups split from a communicator go before it.
  std::reverse(list.begin(), list.end());
  for (Communicator* c : list) c->abort();
}

double Watchdog::limit_locked() const {
  const bool waiting = waits_ > 0 || phase_waits_;
  return options_.timeout_s + (waiting ? grace_s_ : 0.0);
}

double Watchdog::limit_s() const {
  std::lock_guard lock(mutex_);
  return limit_locked();
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const bool waiting = waits_ > 0 || phase_waits_;
    const double limit = limit_locked();
    const double idle = std::chrono::duration<double>(Clock::now() - last_progress_).count();
    if (idle < limit) {
      // Progress does not wake the thread (it stays cheap): the thread wakes at the deadline of
      // the last progress it saw and looks again. Bounded waits keep the arithmetic in range.
      wake_.wait_for(lock, std::chrono::duration<double>(std::min(limit - idle, 60.0)));
      continue;
    }
    const std::string phase = phase_locked();
    lock.unlock();
    write_line(fmt::format("no progress for {:.1f} s in phase '{}'{}; aborting the job", idle,
                           phase, waiting ? " (waiting for the other ranks)" : ""));
    abort_watched();
    // If ending the job hangs too (a launcher that is gone), SIGALRM's default action ends this
    // process. Only a test's end_job returns; the alarm is then called off.
    alarm(30);
    end_job_(kTimeoutExitCode);
    alarm(0);
    return;
  }
}

void Watchdog::fail(std::string_view what, int exit_code) {
  write_line(fmt::format("failed in phase '{}': {}", phase(), what));
  end_job(exit_code);
}

void Watchdog::end_job(int exit_code) {
  abort_watched();
  end_job_(exit_code);
  std::_Exit(exit_code);  // end_job_ does not return; this keeps [[noreturn]] true if it did
}

}  // namespace shardplan::comm
