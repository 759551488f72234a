// The explanation of a recommendation: the job's primary bottleneck and the reasons for the choice
// and against the alternatives, each a claim computed from the evaluations it describes. A claim
// is a small struct holding the numbers it rests on and naming the term that decides it (a memory
// category, a collective, a kind of compute); render() is the one place claims become sentences,
// claim_json() the one place they become JSON, so the table and the JSON say the same thing.
// Advice is given only where the plan was re-evaluated with the change, and quotes the result.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/search.hpp"

namespace shardplan::planner {

enum class Bottleneck { memory_capacity, communication, host_offload, compute };
// "memory capacity", "communication", "offload (CPU optimizer, host transfers)", "compute"
const char* bottleneck_name(Bottleneck b);

// A plan as claims quote it.
struct PlanNumbers {
  std::string name;  // "fsdp-full (fsdp1)", "hsdp (fsdp1) group 8"
  std::int64_t micro_batch = 0;
  double step_s = 0, peak_bytes = 0;
  bool fits = false;
};
PlanNumbers plan_numbers(const Evaluation& e);

// One term of a step or of a peak: "activations" (bytes), "GEMMs" or "exposed all-gather"
// (seconds).
struct Term {
  std::string name;
  double value = 0;
};

// The step's time is mostly GPU compute; `largest` is the compute kind that takes most of it.
struct ComputeBound {
  PlanNumbers plan;
  double compute_s = 0, exposed_s = 0, mfu = 0;
  Term largest;
};
// The GPU waits: on collectives, or on an offload plan's host stream (the CPU optimizer step and
// the transfers); `largest` is the stream the compute stream waits on longest.
struct WaitBound {
  PlanNumbers plan;
  double exposed_s = 0;
  Term largest;
  bool host = false;            // `largest` is the host stream (offload)
  double host_optimizer_s = 0;  // then: its CPU optimizer step
};
// The fastest plan does not fit; `largest` is the biggest category at its peak.
struct CapacityBound {
  PlanNumbers fastest, recommended;
  Term largest;
  double usable_bytes = 0;
};
// No plan fits; `smallest` has the smallest peak, `largest` is the biggest category at that peak.
struct NothingFits {
  PlanNumbers smallest;
  Term largest;
  double usable_bytes = 0;
};
// A family's best plan does not fit; `largest` is the biggest category at its peak, replicated
// when the plan keeps a full copy of it on every GPU.
struct LosesByMemory {
  PlanNumbers plan;
  Term largest;
  bool replicated = false;
  double usable_bytes = 0;
  // The same category between steps (model states; 0 for the others): the optimizer states at the
  // peak may hold the step's temporaries beside them.
  double kept_bytes = 0;
};
// A fitting plan is slower than the winner; the term whose difference is largest decides (the
// step is the compute stream's busy time by kind plus the exposed time by stream).
struct LosesByTime {
  PlanNumbers winner, loser;
  std::string term;
  double winner_term_s = 0, loser_term_s = 0;
};
// Bytes a plan's collectives send per GPU per step, against DDP's.
struct BytesRatio {
  PlanNumbers plan, ddp;
  double bytes = 0, ddp_bytes = 0;
  std::vector<Term> by_op, ddp_by_op;  // bytes by collective ("all-gather"), largest first
};
// The recommended plan uses offload or checkpointing: the same plan re-evaluated without it, and
// what the feature costs.
struct Needed {
  std::string feature;  // "offload params", "full checkpointing"
  PlanNumbers plan, without;
  double usable_bytes = 0;
  Term cost;  // "exposed host transfers" / "recompute", seconds
  double host_optimizer_s = 0;
};
// A job where nothing fits, replanned with one change: the best plan that fits after it (the
// advice helps), or the smallest peak (it does not).
struct Advice {
  std::string change;  // "512 GPUs instead of 64 (...)", "sequence length 65536 instead of 131072"
  PlanNumbers after;
  Term largest_after;  // the biggest category at that plan's peak
  double usable_bytes = 0;
};
// ZeRO-3 and FSDP within a few percent: how their states and buffers differ.
struct CloseFrameworks {
  PlanNumbers zero3, fsdp;
  double zero3_states = 0, zero3_buffers = 0, fsdp_states = 0, fsdp_buffers = 0;
  // What each keeps per parameter element (documents/state_bytes.hpp, its flavour and precision).
  documents::StateBytes zero3_bytes{}, fsdp_bytes{};
  // The step term in which the faster plan gains most over the other (seconds of each), and the
  // category at the peak in which the smaller plan gains most (bytes of each).
  std::string step_term;
  double zero3_term_s = 0, fsdp_term_s = 0;
  std::string peak_term;
  double zero3_peak_term = 0, fsdp_peak_term = 0;
};

using Claim = std::variant<ComputeBound, WaitBound, CapacityBound, NothingFits, LosesByMemory,
                           LosesByTime, BytesRatio, Needed, Advice, CloseFrameworks>;

std::string render(const Claim& c);         // one sentence (or two)
nlohmann::json claim_json(const Claim& c);  // {"kind", "text", and the numbers}

struct Explanation {
  Bottleneck bottleneck = Bottleneck::compute;
  Claim summary;
  std::vector<Claim> reasons;  // most important first
};

// `pins`: what the search was told to keep (advice sets a pinned knob free; a free one was tried).
Explanation explain(const Scenario& sc, const SearchPins& pins, const SearchResult& r);

}  // namespace shardplan::planner
