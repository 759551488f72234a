#include "planner/explain.hpp"

#include <cmath>

#include <fmt/format.h>

namespace shardplan::planner {

using namespace costmodel;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Exposed communication above this share of the step makes communication the bottleneck.
constexpr double kCommBound = 0.15;
// ZeRO-3 and FSDP within this relative step time are "close".
constexpr double kClose = 0.10;
// A plan that does not fit makes memory the bottleneck only if it would be at least this much
// faster than what fits (below it, the printed gain rounds to nothing).
constexpr double kCapacityGain = 0.01;

const Candidate* best_of(const SearchResult& r, const char* strategy) {
  for (const auto& c : r.best_per_family)
    if (c.eval.spec.strategy == strategy) return &c;
  return nullptr;
}

double exposed_share(const Evaluation& e) { return e.result.exposed_comm_s / e.result.step_s; }

std::string plan_name(const Evaluation& e) {
  return fmt::format("{} ({})", e.spec.strategy, flavour_name(e.spec.flavour));
}

}  // namespace

const char* bottleneck_name(Bottleneck b) {
  switch (b) {
    case Bottleneck::memory_capacity: return "memory capacity";
    case Bottleneck::communication: return "communication";
    case Bottleneck::compute: return "compute";
  }
  return "?";
}

Explanation explain(const Scenario& sc, const SearchResult& r) {
  Explanation x;
  const double cap = sc.hardware.memory_bytes / kGiB;
  if (r.ranked.empty()) {
    x.bottleneck = Bottleneck::memory_capacity;
    double smallest = 1e300;
    for (const auto& c : r.best_per_family) smallest = std::min(smallest, c.eval.result.peak_bytes);
    x.summary = fmt::format("nothing fits: the smallest peak of any plan is {:.1f} GiB against {:.1f} GiB "
                            "usable per GPU; more GPUs (to shard over), offload or a shorter sequence are "
                            "needed",
                            smallest / kGiB, sc.usable_bytes() / kGiB);
    return x;
  }
  const Evaluation& rec = r.ranked.front().eval;
  const Evaluation* fastest = r.fastest_ignoring_memory ? &r.fastest_ignoring_memory->eval : nullptr;
  const double share = exposed_share(rec);

  if (fastest && !fastest->fits && fastest->result.step_s < rec.result.step_s * (1 - kCapacityGain)) {
    x.bottleneck = Bottleneck::memory_capacity;
    x.summary = fmt::format(
        "memory capacity: the fastest plan, {} at micro-batch {}, would take {:.3f} s per step but needs "
        "{:.1f} GiB of {:.1f} GiB; what fits costs {:.3f} s ({:+.0f}%)",
        plan_name(*fastest), fastest->job.micro_batch, fastest->result.step_s,
        fastest->result.peak_bytes / kGiB, cap, rec.result.step_s,
        100 * (rec.result.step_s / fastest->result.step_s - 1));
  } else if (share > kCommBound) {
    x.bottleneck = Bottleneck::communication;
    x.summary = fmt::format("communication: {:.0f}% of the recommended step ({:.3f} s of {:.3f} s) waits on "
                            "collectives that compute cannot hide",
                            100 * share, rec.result.exposed_comm_s, rec.result.step_s);
  } else {
    x.bottleneck = Bottleneck::compute;
    x.summary = fmt::format("compute: {:.0f}% of the step is GPU compute (MFU {:.0f}%); only {:.1f}% is "
                            "exposed communication",
                            100 * rec.result.compute_s / rec.result.step_s, 100 * rec.result.mfu, 100 * share);
  }

  // DDP and replication.
  if (const auto* ddp = best_of(r, "ddp"); ddp && !ddp->eval.fits) {
    const auto& s = ddp->eval.result.model_states;
    x.reasons.push_back(fmt::format(
        "DDP replicates everything: {:.1f} GiB of parameters, {:.1f} GiB of gradients and {:.1f} GiB of "
        "optimizer states on every GPU; sharding them over {} GPUs is what makes this job fit. Picking DDP "
        "when replicated state is the bottleneck is the classic mistake.",
        s[0] / kGiB, s[1] / kGiB, s[2] / kGiB, sc.cluster.gpus));
  } else if (ddp && ddp->eval.fits && rec.spec.strategy != "ddp") {
    x.reasons.push_back(fmt::format("DDP fits ({:.1f} GiB peak) but takes {:.3f} s per step against {:.3f} s.",
                                    ddp->eval.result.peak_bytes / kGiB, ddp->eval.result.step_s,
                                    rec.result.step_s));
  }

  // Full sharding: 1.5x the communication; hidden or exposed.
  const Candidate* full = best_of(r, "zero3");
  const Candidate* fsdp = best_of(r, "fsdp-full");
  const Candidate* sharded = full && fsdp ? (better(fsdp->eval, full->eval) ? fsdp : full) : (full ? full : fsdp);
  if (sharded && sharded->eval.result.valid) {
    const auto& e = sharded->eval;
    const double busy = e.result.busy_s[static_cast<int>(Stream::all_gather)] +
                        e.result.busy_s[static_cast<int>(Stream::reduce_scatter)];
    const bool hidden = exposed_share(e) <= kCommBound;
    x.reasons.push_back(fmt::format(
        "{} moves 1.5x DDP's bytes per step (two all-gathers and a reduce-scatter: {:.1f} GB per GPU); its "
        "collectives run {:.3f} s against {:.3f} s of compute, and {:.3f} s ({:.0f}% of its step) is exposed: "
        "{}",
        plan_name(e), e.result.comm_bytes_per_gpu / 1e9, busy, e.result.compute_s, e.result.exposed_comm_s,
        100 * exposed_share(e),
        hidden ? "the interconnect is fast enough to hide it under compute"
               : "the interconnect is too slow to hide it, so less sharding (ZeRO-2, HSDP) or fewer bytes win"));
  }
  if (rec.spec.strategy != "zero3" && rec.spec.strategy != "fsdp-full" && sharded && sharded->eval.fits) {
    x.reasons.push_back(fmt::format("{} wins over full sharding by {:.1f}% of step time: it keeps parameters "
                                    "gathered and avoids re-gathering them in backward.",
                                    plan_name(rec), 100 * (sharded->eval.result.step_s / rec.result.step_s - 1)));
  }
  if (rec.spec.offload != Offload::none)
    x.reasons.push_back(fmt::format("Offload is needed to fit: the CPU step and host transfers add {:.3f} s "
                                    "exposed per step.",
                                    rec.result.exposed_s[static_cast<int>(Stream::host)]));
  if (rec.job.checkpointing != Checkpointing::none)
    x.reasons.push_back(fmt::format("{} activation checkpointing trades {:.3f} s of recompute per step for "
                                    "activation memory.",
                                    checkpointing_label(rec.job), rec.result.recompute_s));

  // ZeRO-3 against FSDP, when close.
  if (full && fsdp && full->eval.fits && fsdp->eval.fits &&
      std::fabs(full->eval.result.step_s / fsdp->eval.result.step_s - 1) < kClose) {
    const auto& z = full->eval.result;
    const auto& f = fsdp->eval.result;
    x.reasons.push_back(fmt::format(
        "ZeRO-3 and FSDP are within {:.1f}% of each other. In numbers: DeepSpeed keeps a bf16 partition plus "
        "an fp32 master and a flat fp32 gradient partition ({:.1f} GiB of states, {:.1f} GiB of buffers with "
        "its reduce buckets at the peak); FSDP keeps fp32 sharded parameters cast to bf16 at all-gather "
        "({:.1f} GiB of states, {:.1f} GiB of buffers); peaks {:.1f} vs {:.1f} GiB. In practice: FSDP2 is "
        "PyTorch-native (DTensor, torch.compile, any torch.optim optimizer, DCP checkpoints that reshard to "
        "another world size); DeepSpeed brings CPU/NVMe offload and its own optimizers, and writes per-rank "
        "partitions consolidated with zero_to_fp32.py.",
        100 * std::fabs(z.step_s / f.step_s - 1), total(z.model_states) / kGiB,
        z.at_peak[static_cast<int>(Category::buffers)] / kGiB, total(f.model_states) / kGiB,
        f.at_peak[static_cast<int>(Category::buffers)] / kGiB, z.peak_bytes / kGiB, f.peak_bytes / kGiB));
  }
  return x;
}

}  // namespace shardplan::planner
