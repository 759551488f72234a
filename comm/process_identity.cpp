#include "comm/process_identity.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>

namespace shardplan::comm {
namespace {
std::atomic<int> this_process_rank{-1};
}  // namespace

std::string host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "unknown-host";
  return std::string(name.data());
}

int process_rank() { return this_process_rank.load(); }
void set_process_rank(int rank) { this_process_rank.store(rank); }

int launcher_rank_from_environment() {
  for (const char* variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(variable)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && rank >= 0) return static_cast<int>(rank);
    }
  }
  return 0;
}

std::optional<double> host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kibibytes = 0;
  while (in >> key >> kibibytes >> unit)
    if (key == "MemTotal:") return kibibytes * 1024.0;  // the kernel's "kB" is KiB
  return std::nullopt;
}

}  // namespace shardplan::comm
