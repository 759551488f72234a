// The command line of `calibrate`: a measuring run (the default command) and
// `import-nccl-tests` (alias `import`). Parsing only; every rejection is an InputError naming the
// flag and the value, which main turns into one line and exit code 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calibrate/fit.hpp"
#include "calibrate/overheads_import.hpp"
#include "calibrate/sweep.hpp"
#include "comm/fault_injection.hpp"
#include "comm/groups.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {

enum class BackendKind { mpi, nccl };
const char* backend_name(BackendKind backend);
// Whether this build can run the backend (mpi needs MPI; nccl needs CUDA and NCCL, and runs under
// MPI when the build has it, or from torchrun's environment).
bool backend_available(BackendKind backend);
// Throws core::InputError (--backend) when this build cannot run the backend.
void require_backend(BackendKind backend);

struct MeasureOptions {
  BackendKind backend = BackendKind::mpi;
  std::vector<documents::Collective> ops;  // in the order given
  SweepRange range;                        // per-backend defaults unless given
  int warmup = 5;                          // nccl-tests -w
  int iters = 20;                          // nccl-tests -n
  bool check = true;                       // nccl-tests -c: one checked run per size
  std::vector<comm::GroupSpec> groups;     // empty: the default groups for the topology
  bool gemm = true;                        // GEMM throughput
  bool memory = true;                      // memory copy bandwidth (and, on CPUs, optimizer rate)
  std::string gemm_model;        // model preset or config.json whose block GEMMs are timed
  std::int64_t gemm_tokens = 0;  // m of those GEMMs (tokens per micro-batch)
  // Sequence length of the model's attention core, timed over gemm_tokens / attention_seq
  // sequences (0: not timed).
  std::int64_t attention_seq = 0;
  // The written profile's device memory (gpu.memory_GiB) in bytes, the size the plans must fit:
  // --gpu-memory-GiB (a new profile only). Unset: what the device has (a CPU rank: the host's
  // memory shared by its ranks).
  std::optional<double> device_memory_bytes;
  std::string out;   // profile to write ("" = default name, or in place)
  std::string into;  // existing profile to merge the calibration into
  FitOptions fit;
  bool accept_poor_fit = false;  // write the profile though a fit misses its goal
  double timeout_s = 300;        // a rank without progress for this long ends the job (watchdog)
  std::optional<comm::FaultInjection> fault;  // --inject-fault (STEP: the sweep point, from 1)
};

struct ImportOptions {
  std::vector<std::string> logs;
  std::optional<int> ranks;                 // overrides the ranks found in each log's header
  std::optional<documents::Tier> tier;      // overrides the tier found from the log's hosts
  std::optional<documents::Collective> op;  // overrides the test named in the log
  std::string out;
  std::string into;
  bool force = false;  // merge logs of another GPU than the profile's (said on the notes)
  FitOptions fit;
  bool accept_poor_fit = false;  // write the calibration though a fit misses its goal
};

struct CommandLine {
  enum class Command { measure, import_logs, import_overheads, help };
  Command command = Command::measure;
  MeasureOptions measure;
  ImportOptions import;
  OverheadsImportOptions overheads;
  std::string help_text;  // for Command::help
};

// Throws core::InputError. Whether this build can run the backend is require_backend's.
CommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace shardplan::calibrate
