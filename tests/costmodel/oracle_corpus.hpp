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
  double error() const {
    return measured == 0 ? (predicted == 0 ? 0 : 1) : (predicted - measured) / measured;
  }
};

// tests/costmodel/data/oracle_units.json: per unit, the bytes autograd keeps for backward.
std::vector<Row> unit_rows(const nlohmann::json& corpus);
// tests/costmodel/data/oracle_steps.json: whole training steps, peak and its categories.
std::vector<Row> step_rows(const nlohmann::json& corpus);

// tests/costmodel/data/oracle_traffic.json: per unit and direction, the bytes the memory-bound ATen
// ops read and write ("block 1/forward", "head/backward", ...), against costmodel/traffic.hpp.
std::vector<Row> traffic_rows(const nlohmann::json& corpus);

nlohmann::json read_corpus(const std::string& file_name);  // from tests/costmodel/data/

}  // namespace shardplan::oracle
