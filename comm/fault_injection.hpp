// Test-only faults (--inject-fault KIND@RANK:STEP) that show a job ends when one rank fails:
//
//   crash   the rank raises SIGSEGV (the watchdog's crash report names it; the launcher ends the
//           others)
//   hang    the rank sleeps for ever; the watchdogs end the job after --timeout-s
//   oom     the rank runs out of memory (the program's own out-of-memory error and exit code)
//   throw   the rank throws an exception (its "failed in phase" line; the job ends with code 1)
//
// STEP counts from 1: the executor's optimizer steps, calibrate's sweep points.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "comm/watchdog.hpp"

namespace shardplan::comm {

enum class FaultKind { crash, hang, oom, exception };

struct FaultInjection {
  FaultKind kind = FaultKind::crash;
  int rank = 0;           // world rank, >= 0
  std::int64_t step = 1;  // >= 1
  bool operator==(const FaultInjection&) const = default;
};

// The syntax, for messages: "crash|hang|oom|throw@RANK:STEP".
inline constexpr const char* kFaultInjectionSyntax = "crash|hang|oom|throw@RANK:STEP";

// "hang@1:3" -> {hang, 1, 3}; nullopt for anything else (no spaces, signs or extra characters;
// RANK >= 0, STEP >= 1).
std::optional<FaultInjection> parse_fault_injection(std::string_view text);
const char* fault_kind_name(FaultKind kind);  // "crash", "hang", "oom", "throw"

// Does the fault when it is due (this rank, this step), after appending " (injected KIND)" to the
// watchdog's phase. crash and hang do not return; throw throws std::runtime_error. oom calls
// out_of_memory, which makes the program run out of memory its own way (the executor's tracked
// allocator loses its free capacity, so the step's next allocation throws OutOfMemory).
void inject_due_fault(const std::optional<FaultInjection>& fault, int rank, std::int64_t step,
                      Watchdog& watchdog, const std::function<void()>& out_of_memory);

}  // namespace shardplan::comm
