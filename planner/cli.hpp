// The `planner` command line: subcommands over the planner library. Returns the exit code:
// 0 success, 2 bad input (one line on stderr naming the field and value), 1 internal error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardplan::planner {
int run_cli(int argc, char** argv);

// One subcommand run as the command line runs it, for callers inside a process (the Python
// module): the same options, the same code, the same output, without argv or the streams.
struct Request {
  std::vector<std::string> args;  // the subcommand and its flags: {"estimate", "--gpus=8", ...}
  // Documents given in place of the --model config.json and the --hardware profile file (read
  // as those files are; nothing is written to disk).
  std::optional<nlohmann::json> model, hardware;
  bool fsdp_as_data = false;  // --emit fsdp: the settings as one JSON object (fsdp_settings_json)
  // A DeepSpeed config in place of estimate's --deepspeed file (read as that file is).
  std::optional<nlohmann::json> deepspeed;
};
struct Response {
  std::string output;              // what the command line prints on stdout
  std::vector<std::string> notes;  // its lines for stderr, without the "planner: " prefix
};
// Throws core::InputError for bad input (CLI11's parse errors at "arguments"); never exits.
Response run_request(const Request& request);
}  // namespace shardplan::planner
