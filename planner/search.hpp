// `planner recommend`'s search: every combination of the knobs the user left free, evaluated with
// the step simulator, ranked by step time (ties to lower memory). Plans that cannot fit are pruned
// without simulating them: a larger micro-batch of a configuration whose smaller micro-batch did
// not fit (activations grow with the micro-batch; nothing else does). The answer equals the
// exhaustive one; tests check it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// Knobs the user pinned (unset = searched).
struct SearchPins {
  std::optional<std::string> strategy;
  std::optional<documents::Flavour> flavour;
  bool pytorch_only = false;  // PyTorch's flavours (ddp, fsdp1, fsdp2): what --emit fsdp can write
  std::optional<std::int64_t> micro_batch;
  bool checkpointing = false;  // the scenario's checkpointing mode (and every:N) is the user's
  bool loss = false;           // the scenario's loss is the user's
  // --losses: losses the search may choose besides the recipe's own, each as a job names it
  // (LossImpl, chunks). None by default: another loss is a change to the user's training code.
  std::vector<std::pair<documents::LossImpl, std::int64_t>> other_losses;
  std::optional<documents::Offload> offload;
  std::optional<int> shard_group_size;
  // --reduce-dtype: every candidate reduces in it; DDP, which has no such setting, is left out.
  std::optional<std::string> reduce_dtype;
  // --backward-prefetch: FSDP1 plans alone, each gathering this many units ahead in backward.
  std::optional<int> backward_prefetch;
  // --deepspeed-optimizer: DeepSpeed's plans alone, each stepping that optimizer
  // (ShardingSpec::torch_optimizer).
  std::optional<bool> torch_optimizer;
  // The flavour's own prefetch only, not the deeper variant (what --emit llm-foundry can write).
  bool default_prefetch = false;
  bool exhaustive = false;  // simulate everything, no pruning (for tests and benchmarks)
};

struct Candidate {
  Evaluation eval;
  std::string family;  // strategy name; hsdp with its group size ("hsdp/8")
};

struct SearchResult {
  std::vector<Candidate> ranked;  // every fitting plan, best first
  std::vector<Candidate>
      best_per_family;  // fitting or not: the best fitting, else the smallest peak
  std::vector<Candidate>
      pareto;  // fitting plans no other fitting plan beats in both memory and time
  std::vector<std::pair<std::string, std::string>> rejected;  // family -> reason in numbers
  std::optional<Candidate> fastest_ignoring_memory;           // for naming the bottleneck
  long plans_considered = 0;                                  // the whole space
  long plans_simulated = 0;                                   // after pruning
  double seconds = 0;
};

// The space: strategies × flavours × shard groups × micro-batches × checkpointing × offload ×
// prefetch depth and bucket size variants.
std::vector<documents::ShardingSpec> strategy_specs(const Scenario& sc, const SearchPins& pins);
SearchResult search(const Scenario& sc, const SearchPins& pins);

// Ranking order: faster first, ties to lower peak memory.
bool better(const Evaluation& a, const Evaluation& b);

}  // namespace shardplan::planner
