#include "planner/search.hpp"

#include <algorithm>
#include <chrono>
#include <map>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/recipe.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;

namespace {

std::string family_of(const ShardingSpec& s) {
  return s.strategy == "hsdp" ? fmt::format("hsdp/{}", s.shard_group_size) : s.strategy;
}

// HSDP shard groups worth trying: divisors of N strictly between 1 and N that either divide a
// node or are whole nodes (a group that straddles node boundaries unevenly has no benefit).
std::vector<int> hsdp_groups(const Cluster& c) {
  std::vector<int> out;
  for (int d = 2; d < c.gpus; ++d)
    if (c.gpus % d == 0 && (c.gpus_per_node % d == 0 || d % c.gpus_per_node == 0)) out.push_back(d);
  return out;
}

std::vector<Offload> offloads_for(const ShardingSpec& s) {
  std::vector<Offload> out = {Offload::none};
  if (!s.shard_optimizer) return out;
  const bool fsdp = s.flavour == Flavour::fsdp1 || s.flavour == Flavour::fsdp2;
  if (!fsdp) out.push_back(Offload::optimizer);
  if (s.shard_parameters) out.push_back(Offload::params);
  return out;
}

}  // namespace

bool better(const Evaluation& a, const Evaluation& b) {
  if (a.result.step_s != b.result.step_s) return a.result.step_s < b.result.step_s;
  // At equal time, the loss the recipe's code already runs: another one is a change to make.
  const bool a_own = a.job.loss == recipe_traits(a.job.recipe).loss,
             b_own = b.job.loss == recipe_traits(b.job.recipe).loss;
  if (a_own != b_own) return a_own;
  return a.result.peak_bytes < b.result.peak_bytes;
}

std::vector<ShardingSpec> strategy_specs(const Scenario& sc, const SearchPins& pins) {
  std::vector<ShardingSpec> out;
  const int G = sc.cluster.gpus_per_node;
  for (const auto& strategy : strategy_names()) {
    if (pins.strategy && *pins.strategy != strategy) continue;
    if (strategy == "hsdp" && sc.cluster.gpus < 2) continue;
    for (Flavour f : flavours_for(strategy)) {
      if (pins.flavour && *pins.flavour != f) continue;
      if (pins.pytorch_only && (f == Flavour::deepspeed || f == Flavour::megatron)) continue;
      // The recipe's code shards the way its framework does: torchtitan with FSDP2 (or DDP), a
      // model under the DeepSpeed engine with ZeRO.
      if (!recipe_traits(sc.job.recipe).runs_under(f)) continue;
      if (pins.reduce_dtype && f == Flavour::ddp) continue;
      if (pins.backward_prefetch && f != Flavour::fsdp1) continue;
      if (pins.torch_optimizer && f != Flavour::deepspeed) continue;
      // A job that names FSDP's mixed precision runs FSDP.
      const bool fsdp = f == Flavour::fsdp1 || f == Flavour::fsdp2;
      if (sc.job.fsdp_mixed_precision && !fsdp) continue;
      std::vector<std::optional<int>> groups = {std::nullopt};
      if (strategy == "hsdp") {
        groups.clear();
        if (pins.shard_group_size)
          groups.push_back(*pins.shard_group_size);
        else
          for (int g : hsdp_groups(sc.cluster)) groups.push_back(g);
      }
      for (const auto& g : groups) {
        ShardingSpec base = with_job_precision(make_spec(strategy, f, G, g), sc.job);
        if (pins.reduce_dtype) base = with_reduce_dtype(base, *pins.reduce_dtype, sc.job);
        if (pins.backward_prefetch) base.backward_prefetch = *pins.backward_prefetch;
        if (pins.torch_optimizer) base.torch_optimizer = *pins.torch_optimizer;
        for (Offload o : offloads_for(base)) {
          if (pins.offload && *pins.offload != o) continue;
          ShardingSpec s = base;
          s.offload = o;
          out.push_back(s);
          // Composer's PURE beside the DEFAULT the recipe trains with (documents::
          // FsdpMixedPrecision): the gradients reduced in the 16-bit compute dtype, half the bytes.
          const DType compute = compute_dtype(sc.job.precision);
          if (!pins.reduce_dtype && !sc.job.fsdp_mixed_precision &&
              !recipe_traits(sc.job.recipe).reduces_in_fp32_only &&
              fsdp_mixed_precision(s, compute) == FsdpMixedPrecision::default_mode) {
            ShardingSpec pure = s;
            pure.reduce_dtype = compute;
            out.push_back(pure);
          }
          // Scheduling variants the frameworks expose: a deeper forward prefetch for sharded
          // parameters (FSDP forward_prefetch / DeepSpeed stage3_prefetch_bucket_size ×4), and
          // smaller gradient buckets (earlier overlap, more collectives).
          if (s.shard_parameters && !pins.default_prefetch) {
            ShardingSpec deep = s;
            deep.forward_prefetch = s.forward_prefetch + 1;
            deep.backward_prefetch = s.backward_prefetch + (pins.backward_prefetch ? 0 : 1);
            deep.max_inflight_allgathers = s.max_inflight_allgathers + 1;
            if (deep.prefetch_bucket_elems > 0) deep.prefetch_bucket_elems *= 4;
            out.push_back(deep);
          }
          // Megatron-LM's --overlap-grad-reduce: its buffer reduced in buckets beside the
          // backward instead of once after it.
          if (s.main_grad_buffer && s.reduce_bucket_bytes == 0)
            out.push_back(with_overlap_grad_reduce(s, sc.cluster.gpus));
          if (s.contiguous_grad_bucket || s.flavour == Flavour::ddp) {
            ShardingSpec small = s;
            small.reduce_bucket_bytes = s.reduce_bucket_bytes / 10;
            small.allgather_bucket_bytes = s.allgather_bucket_bytes / 10;
            out.push_back(small);
          }
        }
      }
    }
  }
  if (out.empty())
    throw InputError("--strategy",
                     fmt::format("the pinned knobs leave no plan to search (check --flavour, "
                                 "--offload and --shard-group-size against the strategy, and "
                                 "the flavours recipe {} shards with)",
                                 recipe_name(sc.job.recipe)));
  return out;
}

namespace {

std::vector<std::int64_t> micro_batches_to_search(const Scenario& sc, const SearchPins& pins) {
  const std::int64_t per_gpu = sc.job.global_batch / sc.cluster.gpus;
  std::vector<std::int64_t> micro_batches;
  for (std::int64_t b = 1; b <= per_gpu; ++b)
    if (per_gpu % b == 0 && (!pins.micro_batch || *pins.micro_batch == b))
      micro_batches.push_back(b);
  if (micro_batches.empty())
    throw InputError("--micro-batch", fmt::format("{} does not divide the {} sequences per GPU",
                                                  pins.micro_batch.value_or(0), per_gpu));
  return micro_batches;
}

// What the user can set in the recipe's code: the checkpointing modes (every other block, and
// torchtitan's op-level policy, beside none and full; Megatron's attention-only recompute only
// changes anything for materialized scores), and the losses the user allows with --losses
// beside the recipe's own.
struct Ckpt {
  Checkpointing mode;
  std::int64_t every;
};

std::vector<Ckpt> checkpointing_to_search(const Scenario& sc, const SearchPins& pins) {
  std::vector<Ckpt> ckpts;
  if (pins.checkpointing) {
    ckpts.push_back({sc.job.checkpointing, sc.job.checkpoint_every});
  } else {
    const RecipeTraits& r = recipe_traits(sc.job.recipe);
    ckpts = {{Checkpointing::none, 0}, {Checkpointing::full, 0}};
    if (sc.model.layers >= 2 && r.offers_every_n) ckpts.push_back({Checkpointing::every, 2});
    if (r.offers_selective_op) ckpts.push_back({Checkpointing::selective_op, 0});
    if (sc.job.attention == AttentionImpl::eager && r.offers_selective_attention)
      ckpts.push_back({Checkpointing::selective_attention, 0});
  }
  return ckpts;
}

struct Loss {
  LossImpl impl;
  std::int64_t chunks;
};

std::vector<Loss> losses_to_search(const Scenario& sc, const SearchPins& pins) {
  std::vector<Loss> losses = {{sc.job.loss, sc.job.loss_chunks}};
  for (const auto& other : pins.other_losses)
    if (std::none_of(losses.begin(), losses.end(), [&](const Loss& l) {
          return l.impl == other.first && l.chunks == other.second;
        }))
      losses.push_back({other.first, other.second});
  return losses;
}

// Why no plan of a family fits, from its plan of the smallest peak.
std::string rejection_reason(const Scenario& sc, const Candidate& c) {
  const double usable = sc.usable_bytes();
  const double overhead = sc.hardware.cuda_context_bytes + sc.hardware.nccl_workspace_bytes;
  const auto& r = c.eval.result;
  const double states = total(r.model_states);
  if (states + overhead > usable) {
    // Name the largest model state: what replication (or the lack of sharding) costs.
    int worst = 0;
    for (int k = 1; k <= static_cast<int>(Category::optimizer_states); ++k)
      if (r.model_states[k] > r.model_states[worst]) worst = k;
    const bool replicated =
        worst == static_cast<int>(Category::optimizer_states) ? !c.eval.spec.shard_optimizer
        : worst == static_cast<int>(Category::gradients)      ? !c.eval.spec.shard_gradients
                                                              : !c.eval.spec.shard_parameters;
    std::string what = category_name(static_cast<Category>(worst));
    std::replace(what.begin(), what.end(), '_', ' ');
    return fmt::format("the model states, {:.1f} GiB, and the device's own {:.1f} GiB (CUDA "
                       "context, NCCL) exceed {:.1f} GiB usable; the largest of them: {}{}, "
                       "{:.1f} GiB",
                       states / kGiB, overhead / kGiB, usable / kGiB,
                       replicated ? "replicated " : "", what, r.model_states[worst] / kGiB);
  }
  return fmt::format(
      "smallest peak {:.1f} GiB (micro-batch {}, {} checkpointing, offload {}) exceeds {:.1f} GiB "
      "usable; at the peak ({}) activations are {:.1f} GiB and buffers {:.1f} GiB",
      r.peak_bytes / kGiB, c.eval.job.micro_batch, checkpointing_label(c.eval.job),
      offload_name(c.eval.spec.offload), usable / kGiB, r.peak_when,
      r.at_peak[static_cast<int>(Category::activations)] / kGiB,
      r.at_peak[static_cast<int>(Category::buffers)] / kGiB);
}

// Pareto front of (peak memory, step time) among fitting plans; ranked is sorted by time.
void add_pareto_front(SearchResult& res) {
  double best_mem = 1e300;
  for (const auto& c : res.ranked)
    if (c.eval.result.peak_bytes < best_mem) {
      res.pareto.push_back(c);
      best_mem = c.eval.result.peak_bytes;
    }
}

}  // namespace

SearchResult search(const Scenario& sc, const SearchPins& pins) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult res;
  const auto specs = strategy_specs(sc, pins);
  const auto micro_batches = micro_batches_to_search(sc, pins);
  const auto ckpts = checkpointing_to_search(sc, pins);
  const auto losses = losses_to_search(sc, pins);

  std::map<std::string, Candidate> best_fit, smallest;
  // Per family, why its offloaded plans could not run (the host's memory), said with its rejection.
  std::map<std::string, std::string> offload_refused;
  for (const auto& spec : specs) {
    const std::string family = family_of(spec);
    for (const auto& ckpt : ckpts)
      for (const auto& loss : losses) {
        bool too_big = false;  // a smaller micro-batch of this configuration did not fit
        for (auto mb : micro_batches) {
          ++res.plans_considered;
          if (too_big && !pins.exhaustive) continue;
          TrainingJob job = sc.job;
          job.micro_batch = mb;
          job.checkpointing = ckpt.mode;
          job.checkpoint_every = ckpt.every;
          job.loss = loss.impl;
          job.loss_chunks = loss.chunks;
          Evaluation e = evaluate(sc, spec, job);
          ++res.plans_simulated;
          if (!e.result.valid) {
            if (e.result.reason_input == "--offload")
              offload_refused.emplace(family, e.result.reason);
            continue;
          }
          Candidate c{e, family};
          if (!res.fastest_ignoring_memory || better(e, res.fastest_ignoring_memory->eval))
            res.fastest_ignoring_memory = c;
          auto it = smallest.find(family);
          if (it == smallest.end() || e.result.peak_bytes < it->second.eval.result.peak_bytes)
            smallest[family] = c;
          if (!e.fits) {
            too_big = true;
            continue;
          }
          res.ranked.push_back(c);
          auto bf = best_fit.find(family);
          if (bf == best_fit.end() || better(e, bf->second.eval)) best_fit[family] = c;
        }
      }
  }
  std::stable_sort(res.ranked.begin(), res.ranked.end(),
                   [](const Candidate& a, const Candidate& b) { return better(a.eval, b.eval); });
  add_pareto_front(res);
  for (const auto& [family, c] : smallest) {
    auto bf = best_fit.find(family);
    res.best_per_family.push_back(bf != best_fit.end() ? bf->second : c);
    if (bf == best_fit.end()) {
      const auto refused = offload_refused.find(family);
      res.rejected.emplace_back(
          family, rejection_reason(sc, c) +
                      (refused == offload_refused.end() ? "" : "; offloaded, " + refused->second));
    }
  }
  // A family none of whose plans could run: only its offloaded ones were tried, and the host
  // refused.
  for (const auto& [family, reason] : offload_refused)
    if (!smallest.count(family)) res.rejected.emplace_back(family, "offloaded, " + reason);
  std::stable_sort(res.best_per_family.begin(), res.best_per_family.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.eval.fits != b.eval.fits) return a.eval.fits;
                     return better(a.eval, b.eval);
                   });
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace shardplan::planner
