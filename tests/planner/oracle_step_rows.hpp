// Whole training steps of the frameworks' corpora (oracle_steps.json, oracle_deepspeed.json)
// predicted by the command a user types: `planner estimate` with the case's flags (or its
// DeepSpeed config as --deepspeed), through planner::run_request, the function the command line
// and the Python module call. Used by the step corpus tests and bench/memory_corpus.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oracle_corpus.hpp"

namespace shardplan::oracle {

// The estimate's arguments for one corpus case ({"estimate", "--format=json", ...}); a
// DeepSpeed case's config goes beside them as the request's deepspeed document.
std::vector<std::string> estimate_args(const nlohmann::json& corpus_case);

// One row per case for the peak, and one per category at the peak ("peak/gradients", ...).
std::vector<Row> step_rows(const nlohmann::json& corpus);

// The bytes one rank sends in the step, by collective ("bytes/all_gather", ...) and in all
// ("bytes/total"), for the cases that recorded their collectives (measure_deepspeed.py): the
// estimate's comm.bytes_by_collective against what the engine asked deepspeed.comm for. Both
// count nccl-tests sizes times the ring's bus factor (documents/collectives.hpp).
std::vector<Row> comm_rows(const nlohmann::json& corpus);

}  // namespace shardplan::oracle
