#include "comm/fault_injection.hpp"

#include <charconv>
#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>
#include <thread>

namespace shardplan::comm {
namespace {

// A whole decimal number, digits only.
template <class T> std::optional<T> parse_number(std::string_view text) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return std::nullopt;
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
  case FaultKind::crash:
    return "crash";
  case FaultKind::hang:
    return "hang";
  case FaultKind::oom:
    return "oom";
  case FaultKind::exception:
    return "throw";
  }
  return "?";
}

std::optional<FaultInjection> parse_fault_injection(std::string_view text) {
  const auto at = text.find('@');
  const auto colon = text.find(':', at == std::string_view::npos ? 0 : at);
  if (at == std::string_view::npos || colon == std::string_view::npos) return std::nullopt;
  FaultInjection fault;
  const auto kind = text.substr(0, at);
  if (kind == "crash")
    fault.kind = FaultKind::crash;
  else if (kind == "hang")
    fault.kind = FaultKind::hang;
  else if (kind == "oom")
    fault.kind = FaultKind::oom;
  else if (kind == "throw")
    fault.kind = FaultKind::exception;
  else
    return std::nullopt;
  const auto rank = parse_number<int>(text.substr(at + 1, colon - at - 1));
  const auto step = parse_number<std::int64_t>(text.substr(colon + 1));
  if (!rank || !step || *step < 1) return std::nullopt;
  fault.rank = *rank;
  fault.step = *step;
  return fault;
}

void inject_due_fault(const std::optional<FaultInjection>& fault, int rank, std::int64_t step,
                      Watchdog& watchdog, const std::function<void()>& out_of_memory) {
  if (!fault || fault->rank != rank || fault->step != step) return;
  watchdog.set_phase(watchdog.phase() + " (injected " + fault_kind_name(fault->kind) + ")");
  switch (fault->kind) {
  case FaultKind::crash:
    std::raise(SIGSEGV);
    std::abort();  // with SIGSEGV ignored, still a crash
  case FaultKind::hang:
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  case FaultKind::oom:
    out_of_memory();
    return;
  case FaultKind::exception:
    throw std::runtime_error("injected failure");
  }
}

}  // namespace shardplan::comm
