#include "planner/explain.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "planner/estimate.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;

namespace {

// Exposed time above this share of the step makes waiting (communication or offload) the
// bottleneck.
constexpr double kWaitBound = 0.15;
// Step times closer than this are a tie: no term decides between them.
constexpr double kTie = 1e-4;
// ZeRO-3 and FSDP within this relative step time are "close".
constexpr double kClose = 0.10;
// A plan that does not fit makes memory the bottleneck only if it would be at least this much
// faster than what fits (below it, the printed gain rounds to nothing).
constexpr double kCapacityGain = 0.01;
// How far the advice scales a job that fits nowhere: GPUs up to this factor, the sequence down by
// it.
constexpr int kMaxScale = 64;

const char* category_label(int c) {
  static const char* labels[kCategories] = {"parameters",  "gradients", "optimizer states",
                                            "activations", "buffers",   "overhead"};
  return labels[c];
}
const char* kind_label(int k) {
  static const char* labels[kComputeKinds] = {"GEMMs",         "attention core", "memory-bound ops",
                                              "host overhead", "recompute",      "optimizer step"};
  return labels[k];
}
std::string op_label(int op) {
  std::string s = traits(static_cast<Collective>(op)).name;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

Term largest_category(const StepResult& r) {
  int worst = 0;
  for (int c = 1; c < kCategories; ++c)
    if (r.at_peak[c] > r.at_peak[worst]) worst = c;
  return {category_label(worst), r.at_peak[worst]};
}

// The step as terms: the compute stream's busy time by kind and the exposed time by stream (plus
// any exposed time no stream claims, last), which together add up to the step.
std::vector<Term> step_terms(const StepResult& r) {
  const auto exposed = exposed_by_wait(r);
  std::vector<Term> t;
  t.reserve(static_cast<std::size_t>(kComputeKinds) + exposed.size() + 1);
  for (int k = 0; k < kComputeKinds; ++k) t.push_back({kind_label(k), r.compute_by_kind_s[k]});
  double attributed = 0;
  for (const auto& [name, s] : exposed) {
    t.push_back({"exposed " + name, s});
    attributed += s;
  }
  t.push_back({"other waiting", r.exposed_comm_s - attributed});
  return t;
}

std::vector<Term> bytes_by_op(const StepResult& r) {
  std::vector<Term> t;
  for (int op = 0; op < kCollectives; ++op)
    if (r.comm_bytes_by_op[op] > 0) t.push_back({op_label(op), r.comm_bytes_by_op[op]});
  std::stable_sort(t.begin(), t.end(),
                   [](const Term& a, const Term& b) { return a.value > b.value; });
  return t;
}

const Candidate* best_of(const SearchResult& r, const char* strategy) {
  for (const auto& c : r.best_per_family)
    if (c.eval.spec.strategy == strategy) return &c;
  return nullptr;
}

double exposed_share(const StepResult& r) { return r.exposed_comm_s / r.step_s; }

// The largest of what the GPU waits for: a collective stream, the host's PCIe copies, or an offload
// plan's CPU optimizer step (planner/estimate.hpp, exposed_by_wait).
WaitBound wait_bound(const Evaluation& e) {
  const auto& r = e.result;
  const auto waits = exposed_by_wait(r);
  std::size_t worst = 0;
  for (std::size_t i = 1; i < waits.size(); ++i)
    if (waits[i].second > waits[worst].second) worst = i;
  const std::string& name = waits[worst].first;
  const bool host = name == stream_name(Stream::host) || name == kCpuOptimizerWait;
  return {plan_numbers(e),
          r.exposed_comm_s,
          {"exposed " + name, waits[worst].second},
          host,
          host ? r.host_optimizer_s : 0};
}

// The two plans' terms by the same names; exposed time no stream claims ("other waiting", which
// the estimate's table does not print and the walk leaves at 0) only where there is some.
void drop_unclaimed_waits(std::vector<Term>& a, const StepResult& ra, std::vector<Term>& b,
                          const StepResult& rb) {
  if (std::abs(a.back().value) <= 1e-9 * ra.step_s &&
      std::abs(b.back().value) <= 1e-9 * rb.step_s) {
    a.pop_back();
    b.pop_back();
  }
}

LosesByTime loses_by_time(const Evaluation& winner, const Evaluation& loser) {
  auto w = step_terms(winner.result), l = step_terms(loser.result);
  drop_unclaimed_waits(w, winner.result, l, loser.result);
  std::size_t worst = 0;
  for (std::size_t i = 1; i < w.size(); ++i)
    if (l[i].value - w[i].value > l[worst].value - w[worst].value) worst = i;
  return {plan_numbers(winner), plan_numbers(loser), w[worst].name, w[worst].value, l[worst].value};
}

// ZeRO-3 against FSDP: their states and buffers; the step term in which the faster of the two
// gains most over the other, and the category at the peak in which the smaller gains most.
CloseFrameworks close_frameworks(const Evaluation& zero3, const Evaluation& fsdp) {
  const auto& z = zero3.result;
  const auto& f = fsdp.result;
  const int buffers = static_cast<int>(Category::buffers);
  CloseFrameworks c;
  c.zero3 = plan_numbers(zero3);
  c.fsdp = plan_numbers(fsdp);
  c.zero3_states = total(z.model_states);
  c.zero3_buffers = z.at_peak[buffers];
  c.fsdp_states = total(f.model_states);
  c.fsdp_buffers = f.at_peak[buffers];
  c.zero3_bytes = state_bytes(zero3.job.precision, zero3.spec, Accounting::framework);
  c.fsdp_bytes = state_bytes(fsdp.job.precision, fsdp.spec, Accounting::framework);
  auto zt = step_terms(z), ft = step_terms(f);
  drop_unclaimed_waits(zt, z, ft, f);
  const double toward_zero3 = z.step_s <= f.step_s ? 1.0 : -1.0;  // gain = slower's term - faster's
  std::size_t term = 0;
  for (std::size_t i = 1; i < zt.size(); ++i)
    if (toward_zero3 * (ft[i].value - zt[i].value) >
        toward_zero3 * (ft[term].value - zt[term].value))
      term = i;
  c.step_term = zt[term].name;
  c.zero3_term_s = zt[term].value;
  c.fsdp_term_s = ft[term].value;
  const double smaller_zero3 = z.peak_bytes <= f.peak_bytes ? 1.0 : -1.0;
  int category = 0;
  for (int k = 1; k < kCategories; ++k)
    if (smaller_zero3 * (f.at_peak[k] - z.at_peak[k]) >
        smaller_zero3 * (f.at_peak[category] - z.at_peak[category]))
      category = k;
  c.peak_term = category_label(category);
  c.zero3_peak_term = z.at_peak[category];
  c.fsdp_peak_term = f.at_peak[category];
  return c;
}

BytesRatio bytes_ratio(const Evaluation& e, const Evaluation& ddp) {
  return {plan_numbers(e),
          plan_numbers(ddp),
          e.result.comm_bytes_per_gpu,
          ddp.result.comm_bytes_per_gpu,
          bytes_by_op(e.result),
          bytes_by_op(ddp.result)};
}

// Whether a change of the job makes some plan fit: the search, pinned as the user pinned it, rerun
// on the changed scenario; its best fitting plan, else its smallest peak.
std::optional<Advice> advice(const std::string& change, const Scenario& changed,
                             const SearchPins& pins, double usable) {
  SearchResult res;
  try {
    res = search(changed, pins);
  } catch (const InputError&) {
    return std::nullopt;  // the pins do not apply to the changed job
  }
  const Candidate* best = res.ranked.empty() ? nullptr : &res.ranked.front();
  for (const auto& c : res.best_per_family)
    if (!best || c.eval.result.peak_bytes < best->eval.result.peak_bytes) best = &c;
  if (!res.ranked.empty()) best = &res.ranked.front();
  if (!best) return std::nullopt;
  return Advice{change, plan_numbers(best->eval), largest_category(best->eval.result), usable};
}

// A job that fits nowhere, replanned with one change at a time: the fewest extra GPUs (keeping the
// sequences per GPU) and the longest shorter sequence that make a plan fit, or the most tried when
// none does; and each knob the user pinned (offload, checkpointing, micro-batch, strategy), set
// free. Knobs the search was free to set were tried already and are not advised.
std::vector<Claim> advise(const Scenario& sc, const SearchPins& pins) {
  std::vector<Claim> out;
  const double usable = sc.usable_bytes();
  std::optional<Advice> last;
  for (int k = 2; k <= kMaxScale; k *= 2) {
    Scenario more = sc;
    more.cluster.gpus *= k;
    more.job.global_batch *= k;
    const auto per_gpu = sc.job.global_batch / sc.cluster.gpus;
    last = advice(fmt::format("{} GPUs instead of {} ({} sequence{} per GPU, as before)",
                              more.cluster.gpus, sc.cluster.gpus, per_gpu, per_gpu == 1 ? "" : "s"),
                  more, pins, usable);
    if (last && last->after.fits) break;
  }
  if (last) out.push_back(*last);
  last.reset();
  for (int k = 2; k <= kMaxScale && sc.job.seq_len / k >= 1; k *= 2) {
    Scenario shorter = sc;
    shorter.job.seq_len /= k;
    last =
        advice(fmt::format("sequence length {} instead of {}", shorter.job.seq_len, sc.job.seq_len),
               shorter, pins, usable);
    if (last && last->after.fits) break;
  }
  if (last) out.push_back(*last);
  auto unpin = [&](const std::string& change, const SearchPins& freed) {
    auto a = advice(change, sc, freed, usable);
    if (a && a->after.fits) out.push_back(*a);
  };
  if (pins.offload) {
    SearchPins p = pins;
    p.offload.reset();
    unpin("offload allowed", p);
  }
  if (pins.checkpointing) {
    SearchPins p = pins;
    p.checkpointing = false;
    unpin("activation checkpointing chosen by the search", p);
  }
  if (pins.micro_batch) {
    SearchPins p = pins;
    p.micro_batch.reset();
    unpin("the micro-batch chosen by the search", p);
  }
  if (pins.strategy || pins.flavour || pins.shard_group_size) {
    SearchPins p;  // the same pins but the strategy's
    p.micro_batch = pins.micro_batch;
    p.checkpointing = pins.checkpointing;
    p.loss = pins.loss;
    p.offload = pins.offload;
    unpin("any strategy", p);
  }
  return out;
}

nlohmann::json plan_json(const PlanNumbers& p) {
  return {{"plan", p.name},
          {"micro_batch", p.micro_batch},
          {"step_s", p.step_s},
          {"peak_bytes", p.peak_bytes},
          {"fits", p.fits}};
}
nlohmann::json term_json(const Term& t) { return {{"name", t.name}, {"value", t.value}}; }
nlohmann::json terms_json(const std::vector<Term>& ts) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& t : ts) a.push_back(term_json(t));
  return a;
}

std::string plan_at(const PlanNumbers& p) {
  return fmt::format("{} at micro-batch {}", p.name, p.micro_batch);
}
std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }
std::string gib1(double bytes) { return fmt::format("{:.1f} GiB", bytes / kGiB); }
std::string ops_text(const std::vector<Term>& ts) {
  std::string s;
  for (const auto& t : ts) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", t.name, gb(t.value));
  return s;
}
std::string percent_slower(double slow, double fast) {
  const double p = 100 * (slow / fast - 1);
  return p < 1 ? fmt::format("{:.2f}%", p) : fmt::format("{:.1f}%", p);
}

// "zero3 (deepspeed) keeps 2 B of parameters, 2 B of gradients, a 4 B master copy and 4 B per
// optimizer moment per parameter": the plan's own bytes per element (sharded ones before sharding).
std::string keeps(const std::string& name, const documents::StateBytes& b) {
  return fmt::format("{} keeps {:g} B of parameters, {:g} B of gradients, {} and {:g} B per "
                     "optimizer moment per parameter",
                     name, b.param, b.grad,
                     b.master > 0 ? fmt::format("a {:g} B master copy", b.master)
                                  : std::string("no separate master copy"),
                     b.moment);
}

// The one place claims become sentences.
struct Render {
  std::string operator()(const ComputeBound& c) const {
    return fmt::format(
        "compute: {:.1f}% of the step ({} of {}) is GPU compute, most of it {} ({}); "
        "exposed communication is {} ({:.1f}%), MFU {:.0f}%",
        100 * c.compute_s / c.plan.step_s, seconds(c.compute_s), seconds(c.plan.step_s),
        c.largest.name, seconds(c.largest.value), seconds(c.exposed_s),
        100 * c.exposed_s / c.plan.step_s, 100 * c.mfu);
  }
  std::string operator()(const WaitBound& c) const {
    std::string s = fmt::format("{}: the GPU waits {} of the {} step ({:.0f}%), most of it {} ({})",
                                c.host ? "offload" : "communication", seconds(c.exposed_s),
                                seconds(c.plan.step_s), 100 * c.exposed_s / c.plan.step_s,
                                c.largest.name, seconds(c.largest.value));
    if (c.host_optimizer_s > 0 && c.largest.name != fmt::format("exposed {}", kCpuOptimizerWait))
      s += fmt::format("; the CPU optimizer step takes {} besides", seconds(c.host_optimizer_s));
    return s;
  }
  std::string operator()(const CapacityBound& c) const {
    return fmt::format(
        "memory capacity: the fastest plan, {}, would take {} per step but its peak is {}, "
        "most of it {} ({}), against {} usable; what fits costs {} (+{})",
        plan_at(c.fastest), seconds(c.fastest.step_s), gib1(c.fastest.peak_bytes), c.largest.name,
        gib1(c.largest.value), gib1(c.usable_bytes), seconds(c.recommended.step_s),
        percent_slower(c.recommended.step_s, c.fastest.step_s));
  }
  std::string operator()(const NothingFits& c) const {
    return fmt::format(
        "nothing fits: the smallest peak of any plan is {} ({}), most of it {} ({}), against {} "
        "usable per GPU",
        gib1(c.smallest.peak_bytes), plan_at(c.smallest), c.largest.name, gib1(c.largest.value),
        gib1(c.usable_bytes));
  }
  std::string operator()(const LosesByMemory& c) const {
    const std::string kept =
        c.kept_bytes > 0 && c.largest.value > c.kept_bytes
            ? fmt::format(", {} of them kept between steps and {} the step's temporaries",
                          gib1(c.kept_bytes), gib1(c.largest.value - c.kept_bytes))
            : "";
    return fmt::format(
        "{} does not fit: its smallest peak is {} against {} usable, the largest part {}{} ({}{})",
        c.plan.name, gib1(c.plan.peak_bytes), gib1(c.usable_bytes),
        c.replicated ? "replicated " : "", c.largest.name, gib1(c.largest.value), kept);
  }
  std::string operator()(const LosesByTime& c) const {
    if (c.loser.step_s - c.winner.step_s < kTie * c.winner.step_s)
      return fmt::format("{} is within {}% of {}'s step time ({} against {})", plan_at(c.loser),
                         100 * kTie, plan_at(c.winner), seconds(c.loser.step_s),
                         seconds(c.winner.step_s));
    return fmt::format(
        "{} is {} slower than {} ({} against {}); the largest difference is {}: {} against {}",
        plan_at(c.loser), percent_slower(c.loser.step_s, c.winner.step_s), plan_at(c.winner),
        seconds(c.loser.step_s), seconds(c.winner.step_s), c.term, seconds(c.loser_term_s),
        seconds(c.winner_term_s));
  }
  std::string operator()(const BytesRatio& c) const {
    return fmt::format("{} sends {:.2f}x the bytes of {} per GPU per step: {} ({}) against {} ({})",
                       plan_at(c.plan), c.bytes / c.ddp_bytes, plan_at(c.ddp), gb(c.bytes),
                       ops_text(c.by_op), gb(c.ddp_bytes), ops_text(c.ddp_by_op));
  }
  std::string operator()(const Needed& c) const {
    std::string cost = fmt::format("{} of {}", seconds(c.cost.value), c.cost.name);
    if (c.host_optimizer_s > 0)
      cost += fmt::format(" ({} of it the CPU optimizer step)", seconds(c.host_optimizer_s));
    if (!c.without.fits)
      return fmt::format("{} is needed to fit: without it the same plan's peak is {} against {} "
                         "usable; it costs {} "
                         "per step",
                         c.feature, gib1(c.without.peak_bytes), gib1(c.usable_bytes), cost);
    return fmt::format("{} is not needed to fit: without it the same plan's peak is {} and its "
                       "step {} against {}; "
                       "it costs {} per step",
                       c.feature, gib1(c.without.peak_bytes), seconds(c.without.step_s),
                       seconds(c.plan.step_s), cost);
  }
  std::string operator()(const Advice& c) const {
    if (c.after.fits)
      return fmt::format("with {}, {} fits: peak {} against {} usable, step {}", c.change,
                         plan_at(c.after), gib1(c.after.peak_bytes), gib1(c.usable_bytes),
                         seconds(c.after.step_s));
    return fmt::format(
        "even with {}, nothing fits: the smallest peak is {} ({}), most of it {} ({}), against {} "
        "usable",
        c.change, gib1(c.after.peak_bytes), plan_at(c.after), c.largest_after.name,
        gib1(c.largest_after.value), gib1(c.usable_bytes));
  }
  std::string operator()(const CloseFrameworks& c) const {
    const bool zero3_faster = c.zero3.step_s <= c.fsdp.step_s;
    const PlanNumbers& fast = zero3_faster ? c.zero3 : c.fsdp;
    const PlanNumbers& slow = zero3_faster ? c.fsdp : c.zero3;
    const std::string time =
        slow.step_s - fast.step_s < kTie * fast.step_s
            ? fmt::format("their steps tie within {}% ({} against {})", 100 * kTie,
                          seconds(c.zero3.step_s), seconds(c.fsdp.step_s))
            : fmt::format("{} is {} faster ({} against {}), its largest gain in {} ({} against {})",
                          plan_at(fast), percent_slower(slow.step_s, fast.step_s),
                          seconds(fast.step_s), seconds(slow.step_s), c.step_term,
                          seconds(zero3_faster ? c.zero3_term_s : c.fsdp_term_s),
                          seconds(zero3_faster ? c.fsdp_term_s : c.zero3_term_s));
    const bool zero3_smaller = c.zero3.peak_bytes <= c.fsdp.peak_bytes;
    const double peak_gap = std::fabs(c.zero3.peak_bytes - c.fsdp.peak_bytes);
    const std::string memory =
        peak_gap == 0
            ? std::string("their peaks are equal")
            : fmt::format("{}'s peak is {} smaller, its largest gain in {} ({} against {})",
                          (zero3_smaller ? c.zero3 : c.fsdp).name, gib1(peak_gap), c.peak_term,
                          gib1(zero3_smaller ? c.zero3_peak_term : c.fsdp_peak_term),
                          gib1(zero3_smaller ? c.fsdp_peak_term : c.zero3_peak_term));
    return fmt::format("ZeRO-3 and FSDP are within {} of each other's step. In numbers: {} ({} "
                       "of states, {} of buffers at the peak); {} ({} of states, {} of buffers); "
                       "peaks {} vs {}. Here {}; {}.",
                       percent_slower(slow.step_s, fast.step_s), keeps(c.zero3.name, c.zero3_bytes),
                       gib1(c.zero3_states), gib1(c.zero3_buffers),
                       keeps(c.fsdp.name, c.fsdp_bytes), gib1(c.fsdp_states), gib1(c.fsdp_buffers),
                       gib1(c.zero3.peak_bytes), gib1(c.fsdp.peak_bytes), time, memory);
  }
};

nlohmann::json state_bytes_json(const documents::StateBytes& b) {
  return {{"parameters", b.param},
          {"gradients", b.grad},
          {"master", b.master},
          {"per_moment", b.moment}};
}

struct ToJson {
  nlohmann::json operator()(const ComputeBound& c) const {
    return {{"kind", "compute_bound"},
            {"plan", plan_json(c.plan)},
            {"compute_s", c.compute_s},
            {"exposed_s", c.exposed_s},
            {"mfu", c.mfu},
            {"largest", term_json(c.largest)}};
  }
  nlohmann::json operator()(const WaitBound& c) const {
    return {{"kind", "wait_bound"},     {"plan", plan_json(c.plan)},
            {"exposed_s", c.exposed_s}, {"largest", term_json(c.largest)},
            {"host", c.host},           {"host_optimizer_s", c.host_optimizer_s}};
  }
  nlohmann::json operator()(const CapacityBound& c) const {
    return {{"kind", "capacity_bound"},
            {"fastest", plan_json(c.fastest)},
            {"recommended", plan_json(c.recommended)},
            {"largest", term_json(c.largest)},
            {"usable_bytes", c.usable_bytes}};
  }
  nlohmann::json operator()(const NothingFits& c) const {
    return {{"kind", "nothing_fits"},
            {"smallest", plan_json(c.smallest)},
            {"largest", term_json(c.largest)},
            {"usable_bytes", c.usable_bytes}};
  }
  nlohmann::json operator()(const LosesByMemory& c) const {
    return {{"kind", "loses_by_memory"},       {"plan", plan_json(c.plan)},
            {"largest", term_json(c.largest)}, {"replicated", c.replicated},
            {"usable_bytes", c.usable_bytes},  {"kept_bytes", c.kept_bytes}};
  }
  nlohmann::json operator()(const LosesByTime& c) const {
    return {{"kind", "loses_by_time"},          {"winner", plan_json(c.winner)},
            {"loser", plan_json(c.loser)},      {"term", c.term},
            {"winner_term_s", c.winner_term_s}, {"loser_term_s", c.loser_term_s}};
  }
  nlohmann::json operator()(const BytesRatio& c) const {
    return {{"kind", "bytes_ratio"},
            {"plan", plan_json(c.plan)},
            {"ddp", plan_json(c.ddp)},
            {"bytes", c.bytes},
            {"ddp_bytes", c.ddp_bytes},
            {"ratio", c.bytes / c.ddp_bytes},
            {"by_collective", terms_json(c.by_op)},
            {"ddp_by_collective", terms_json(c.ddp_by_op)}};
  }
  nlohmann::json operator()(const Needed& c) const {
    return {{"kind", "needed"},
            {"feature", c.feature},
            {"plan", plan_json(c.plan)},
            {"without", plan_json(c.without)},
            {"usable_bytes", c.usable_bytes},
            {"cost", term_json(c.cost)},
            {"host_optimizer_s", c.host_optimizer_s}};
  }
  nlohmann::json operator()(const Advice& c) const {
    return {{"kind", "advice"},
            {"change", c.change},
            {"helps", c.after.fits},
            {"after", plan_json(c.after)},
            {"largest_after", term_json(c.largest_after)},
            {"usable_bytes", c.usable_bytes}};
  }
  nlohmann::json operator()(const CloseFrameworks& c) const {
    return {{"kind", "close_frameworks"},
            {"zero3", plan_json(c.zero3)},
            {"fsdp", plan_json(c.fsdp)},
            {"zero3_states_bytes", c.zero3_states},
            {"zero3_buffers_bytes", c.zero3_buffers},
            {"fsdp_states_bytes", c.fsdp_states},
            {"fsdp_buffers_bytes", c.fsdp_buffers},
            {"zero3_bytes_per_parameter", state_bytes_json(c.zero3_bytes)},
            {"fsdp_bytes_per_parameter", state_bytes_json(c.fsdp_bytes)},
            {"step_term", c.step_term},
            {"zero3_term_s", c.zero3_term_s},
            {"fsdp_term_s", c.fsdp_term_s},
            {"peak_term", c.peak_term},
            {"zero3_peak_term_bytes", c.zero3_peak_term},
            {"fsdp_peak_term_bytes", c.fsdp_peak_term}};
  }
};

}  // namespace

const char* bottleneck_name(Bottleneck b) {
  switch (b) {
  case Bottleneck::memory_capacity:
    return "memory capacity";
  case Bottleneck::communication:
    return "communication";
  case Bottleneck::host_offload:
    return "offload (CPU optimizer, host transfers)";
  case Bottleneck::compute:
    return "compute";
  }
  return "?";
}

PlanNumbers plan_numbers(const Evaluation& e) {
  std::string name = fmt::format("{} ({})", e.spec.strategy, flavour_name(e.spec.flavour));
  if (e.spec.shard_group_size > 0) name += fmt::format(" group {}", e.spec.shard_group_size);
  if (e.spec.offload != Offload::none)
    name += fmt::format(" offload {}", offload_name(e.spec.offload));
  return {name, e.job.micro_batch, e.result.step_s, e.result.peak_bytes, e.fits};
}

std::string render(const Claim& c) { return std::visit(Render{}, c); }

nlohmann::json claim_json(const Claim& c) {
  auto j = std::visit(ToJson{}, c);
  j["text"] = render(c);
  return j;
}

namespace {

// No plan fits: the plan of the smallest peak, and the advice.
Explanation explain_nothing_fits(const Scenario& sc, const SearchPins& pins,
                                 const SearchResult& r) {
  Explanation x;
  const double usable = sc.usable_bytes();
  x.bottleneck = Bottleneck::memory_capacity;
  const Candidate* smallest = nullptr;
  for (const auto& c : r.best_per_family)
    if (!smallest || c.eval.result.peak_bytes < smallest->eval.result.peak_bytes) smallest = &c;
  if (!smallest) {
    x.summary = NothingFits{{"no runnable plan", 0, 0, 0, false}, {"", 0}, usable};
    return x;
  }
  x.summary =
      NothingFits{plan_numbers(smallest->eval), largest_category(smallest->eval.result), usable};
  x.reasons = advise(sc, pins);
  return x;
}

// The bottleneck of the recommended plan, and the summary that says so.
// `evaluated`: plans the explanation evaluated beside the search's (what a need costs): the fastest
// plan ignoring memory is the fastest of all that were evaluated, so no claim quotes a faster one.
void add_summary(Explanation& x, const SearchResult& r, double usable,
                 const std::vector<Evaluation>& evaluated) {
  const Evaluation& rec = r.ranked.front().eval;
  const Evaluation* fastest =
      r.fastest_ignoring_memory ? &r.fastest_ignoring_memory->eval : nullptr;
  for (const auto& e : evaluated)
    if (e.result.valid && (!fastest || e.result.step_s < fastest->result.step_s)) fastest = &e;
  const bool waits = exposed_share(rec.result) > kWaitBound;
  if (fastest && !fastest->fits &&
      fastest->result.step_s < rec.result.step_s * (1 - kCapacityGain)) {
    x.bottleneck = Bottleneck::memory_capacity;
    x.summary = CapacityBound{plan_numbers(*fastest), plan_numbers(rec),
                              largest_category(fastest->result), usable};
    if (waits) x.reasons.push_back(wait_bound(rec));
  } else if (waits) {
    const WaitBound w = wait_bound(rec);
    x.bottleneck = w.host ? Bottleneck::host_offload : Bottleneck::communication;
    x.summary = w;
  } else {
    x.bottleneck = Bottleneck::compute;
    int kind = 0;
    for (int k = 1; k < kComputeKinds; ++k)
      if (rec.result.compute_by_kind_s[k] > rec.result.compute_by_kind_s[kind]) kind = k;
    x.summary = ComputeBound{plan_numbers(rec),
                             rec.result.compute_s,
                             rec.result.exposed_comm_s,
                             rec.result.mfu,
                             {kind_label(kind), rec.result.compute_by_kind_s[kind]}};
  }
}

// What the recommended plan needs to fit, and what that costs; the plans without it evaluated.
struct Needs {
  std::vector<Claim> claims;
  std::vector<Evaluation> without;
};
Needs needs_of(const Scenario& sc, const Evaluation& rec, double usable) {
  Needs n;
  if (rec.spec.offload != Offload::none) {
    ShardingSpec spec = rec.spec;
    spec.offload = Offload::none;
    const int host = static_cast<int>(Stream::host);
    n.without.push_back(evaluate(sc, spec, rec.job));
    n.claims.emplace_back(Needed{fmt::format("offload {}", offload_name(rec.spec.offload)),
                                 plan_numbers(rec),
                                 plan_numbers(n.without.back()),
                                 usable,
                                 {fmt::format("exposed host transfers and {}", kCpuOptimizerWait),
                                  rec.result.exposed_s[host]},
                                 rec.result.host_optimizer_s});
  }
  if (rec.job.checkpointing != Checkpointing::none) {
    TrainingJob job = rec.job;
    job.checkpointing = Checkpointing::none;
    n.without.push_back(evaluate(sc, rec.spec, job));
    n.claims.emplace_back(
        Needed{fmt::format("{} activation checkpointing", checkpointing_label(rec.job)),
               plan_numbers(rec),
               plan_numbers(n.without.back()),
               usable,
               {"recompute", rec.result.recompute_s},
               0});
  }
  return n;
}

// Against the alternatives: DDP, the best fully sharded plan and the runner-up family; ZeRO-3
// against FSDP, when close.
void add_alternatives(Explanation& x, const SearchResult& r, double usable) {
  const Evaluation& rec = r.ranked.front().eval;
  const Candidate* ddp = best_of(r, "ddp");
  const Candidate* zero3 = best_of(r, "zero3");
  const Candidate* fsdp = best_of(r, "fsdp-full");
  const Candidate* full =
      zero3 && fsdp ? (better(fsdp->eval, zero3->eval) ? fsdp : zero3) : (zero3 ? zero3 : fsdp);
  const Candidate* runner_up = nullptr;
  for (const auto& c : r.best_per_family)
    if (c.eval.fits && c.family != r.ranked.front().family) {
      runner_up = &c;
      break;
    }
  if (ddp && !ddp->eval.fits && ddp->eval.result.valid) {
    const auto& s = ddp->eval.spec;
    const Term largest = largest_category(ddp->eval.result);
    const bool replicated =
        (largest.name == category_label(static_cast<int>(Category::parameters)) &&
         !s.shard_parameters) ||
        (largest.name == category_label(static_cast<int>(Category::gradients)) &&
         !s.shard_gradients) ||
        (largest.name == category_label(static_cast<int>(Category::optimizer_states)) &&
         !s.shard_optimizer);
    double kept = 0;
    for (int k = 0; k <= static_cast<int>(Category::optimizer_states); ++k)
      if (largest.name == category_label(k)) kept = ddp->eval.result.model_states[k];
    x.reasons.push_back(LosesByMemory{plan_numbers(ddp->eval), largest, replicated, usable, kept});
  }
  std::vector<std::string> compared = {r.ranked.front().family};
  for (const Candidate* c : {runner_up, full, ddp}) {
    if (!c || !c->eval.fits ||
        std::find(compared.begin(), compared.end(), c->family) != compared.end())
      continue;
    compared.push_back(c->family);
    x.reasons.push_back(loses_by_time(rec, c->eval));
  }
  // Traffic against DDP, where DDP runs the job: the recommendation's (what its sharding costs or
  // saves on the wire), and the fully sharded plan's where it loses and sends more.
  if (ddp && ddp->eval.fits && ddp->eval.result.comm_bytes_per_gpu > 0) {
    const double ddp_bytes = ddp->eval.result.comm_bytes_per_gpu;
    if (rec.spec.strategy != "ddp") x.reasons.push_back(bytes_ratio(rec, ddp->eval));
    if (full && full->family != r.ranked.front().family && full->eval.result.valid &&
        full->eval.result.comm_bytes_per_gpu > ddp_bytes)
      x.reasons.push_back(bytes_ratio(full->eval, ddp->eval));
  }

  // ZeRO-3 against FSDP, when close.
  if (zero3 && fsdp && zero3->eval.fits && fsdp->eval.fits &&
      std::fabs(zero3->eval.result.step_s / fsdp->eval.result.step_s - 1) < kClose) {
    x.reasons.push_back(close_frameworks(zero3->eval, fsdp->eval));
  }
}

}  // namespace

Explanation explain(const Scenario& sc, const SearchPins& pins, const SearchResult& r) {
  if (r.ranked.empty()) return explain_nothing_fits(sc, pins, r);
  Explanation x;
  const double usable = sc.usable_bytes();
  const Needs needs = needs_of(sc, r.ranked.front().eval, usable);
  add_summary(x, r, usable, needs.without);
  x.reasons.insert(x.reasons.end(), needs.claims.begin(), needs.claims.end());
  add_alternatives(x, r, usable);
  return x;
}

}  // namespace shardplan::planner
