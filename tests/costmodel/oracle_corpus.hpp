// The cost model against what PyTorch itself allocates: the corpora that validation/ measures with
// the frameworks' own code (transformers, torchtitan; torch's saved-tensor hooks and MemTracker),
// read back and compared, one row per quantity. Used by the corpus tests and by
// bench/memory_corpus (the table).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardplan::oracle {

struct Row {
  std::string case_id;
  std::string recipe;
  std::string quantity;  // "block 1", "head", "total", "peak", "peak/activations", ...
  double predicted = 0;  // bytes
  double measured = 0;   // bytes
  std::string skipped;   // why this case is not compared (empty: compared)
  // Where the harness measured a case more than once (ranks, repeats: gloo's threads free
  // collective buffers at moments that vary), the peaks' range; else both are `measured`.
  double measured_low = 0, measured_high = 0;
  double error() const {
    return measured == 0 ? (predicted == 0 ? 0 : 1) : (predicted - measured) / measured;
  }
  // The error against the nearest measurement of the range: 0 inside it.
  double range_error() const {
    const double low = measured_high > 0 ? measured_low : measured;
    const double high = measured_high > 0 ? measured_high : measured;
    if (predicted < low) return (predicted - low) / low;
    if (predicted > high) return (predicted - high) / high;
    return 0;
  }
};

// tests/costmodel/data/oracle_units.json: per unit, the bytes autograd keeps for backward.
std::vector<Row> unit_rows(const nlohmann::json& corpus);
// Whole steps (oracle_steps.json, oracle_deepspeed.json) are predicted through the planner's
// command: tests/planner/oracle_step_rows.hpp.

// tests/costmodel/data/oracle_traffic.json: per unit and direction, the bytes the memory-bound ATen
// ops read and write ("block 1/forward", "head/backward", ...), against costmodel/traffic.hpp.
std::vector<Row> traffic_rows(const nlohmann::json& corpus);

// Why a case says nothing about what a GPU run keeps (empty: it does): dropout inside sdpa,
// sdpa's math path on CPU.
std::string cpu_only_reason(const nlohmann::json& configs, const nlohmann::json& corpus_case);

nlohmann::json read_corpus(const std::string& file_name);  // from tests/costmodel/data/
nlohmann::json read_corpus_file(const std::string& path);  // any corpus file

}  // namespace shardplan::oracle
