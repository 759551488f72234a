// Who this process is, for labelling errors: its host name and its rank in the world (set once the
// launcher's world is known; -1 before).
#pragma once

#include <optional>
#include <string>

namespace shardplan::comm {

std::string host_name();
// The host's memory in bytes (/proc/meminfo's MemTotal), or nothing when it cannot be read.
std::optional<double> host_memory_bytes();
int process_rank();
void set_process_rank(int world_rank);
// The rank the launcher assigned (mpirun, srun, PMIx), read from the environment before MPI is
// initialized; 0 when none is set (a process started by hand).
int launcher_rank_from_environment();

}  // namespace shardplan::comm
