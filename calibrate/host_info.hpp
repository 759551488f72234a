// Facts about the host that a CPU profile records: its memory, its CPU model, and the time.
#pragma once

#include <optional>
#include <string>

namespace shardplan::calibrate {

// "model name" from /proc/cpuinfo ("" where there is none).
std::string cpu_model_name();
// Now, UTC, ISO 8601 to the second: "2025-01-31T12:34:56Z".
std::string utc_timestamp();

}  // namespace shardplan::calibrate
