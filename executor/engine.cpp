#include "executor/engine.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <time.h>

#include <fmt/format.h>

#include "executor/param_init.hpp"
#include "executor/synthetic_data.hpp"
#include "executor/timed_communicator.hpp"

namespace shardplan::executor {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kF32 = comm::DataType::f32;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time of the calling thread (POSIX CLOCK_THREAD_CPUTIME_ID), seconds.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void check_group(const comm::Communicator* c, int size, int rank, const char* name) {
  if (c == nullptr)
    throw std::invalid_argument(fmt::format("the {} group is missing", name));
  if (c->size() != size || c->rank() != rank)
    throw std::invalid_argument(
        fmt::format("the {} group has rank {} of {}, the layout needs {} of {}", name, c->rank(),
                    c->size(), rank, size));
}

} // namespace

struct ShardingEngine::State {
  struct Unit {
    Buffer params;  // chunk (sharded) or whole
    Buffer exp_avg; // chunk (sharded optimizer) or whole
    Buffer exp_avg_sq;
    Buffer grads;      // whole gradient, unsharded gradients: alive from first use to step end
    Buffer fresh;      // full gradient of one micro-batch, sharded gradients
    Buffer grad_shard; // reduced chunk, sharded gradients: from its first reduce to step end
    Buffer gathered;   // all-gathered parameters while the unit is in use
  };
  struct Pending {
    std::int64_t unit;
    std::int64_t offset; // in the current contiguous bucket
  };

  State(EngineOptions opts, TrackedAllocator& a, EngineGroups groups)
      : o(std::move(opts)),
        alloc(a),
        g(groups),
        host_backend(o.backend ? nullptr : std::make_unique<HostBackend<float>>()),
        be(o.backend ? *o.backend : *host_backend),
        model(o.model, a, o.model_options, &be) {}

  using Part = Backend<float>::Part;

  EngineOptions o;
  TrackedAllocator& alloc;
  EngineGroups g;
  std::unique_ptr<Backend<float>> host_backend; // when none is given
  Backend<float>& be;
  GptModel<float> model;
  ShardLayout sl;
  CollectiveStats stats; // of the current step
  // The shard group's all-gathers, its reductions (the same group, on a GPU its own stream) and
  // the replica group's all-reduce; each counted in `stats`.
  std::unique_ptr<TimedCommunicator> shard, reduce, replica;
  std::vector<Unit> units;
  Buffer head_embedding; // tied head under sharded parameters: the embedding gathered again
  Buffer ddp_bucket;     // grad_bucket_copy: every unit's gradient, concatenated
  std::vector<std::int64_t> ddp_offset;
  std::array<Buffer, 2> buckets; // contiguous_grad_bucket (the second with flat_grad_partition)
  std::array<bool, 2> bucket_in_flight{}; // reduced from and not waited for since
  int bucket_index = 0;
  std::int64_t bucket_used = 0; // floats
  double pending_bytes = 0;     // the cost model's count: elements × reduce dtype bytes
  std::vector<Pending> pending;
  std::int64_t step_count = 0;
  int fwd_prefetch = 0, bwd_prefetch = 0;
  double compute_cpu_s = 0;

  std::int64_t unit_count() const { return static_cast<std::int64_t>(units.size()); }
  const UnitShards& shape(std::int64_t u) const { return sl.units[static_cast<std::size_t>(u)]; }
  Unit& unit(std::int64_t u) { return units[static_cast<std::size_t>(u)]; }
  bool tied() const { return o.model.tied_embeddings; }
  bool is_head(std::int64_t u) const { return u == unit_count() - 1; }
  int world_rank() const { return sl.replica_rank * sl.group + sl.shard_rank; }

  // A unit needs a gather before it runs: its parameters are partitioned, or it is a tied head
  // whose output matrix lives in the partitioned embedding unit (the cost model's head gather
  // includes the embedding matrix).
  bool needs_gather(std::int64_t u) const {
    return shape(u).params_sharded || (is_head(u) && tied() && shape(0).params_sharded);
  }
  bool alive(std::int64_t u) {
    return !unit(u).gathered.empty() || (is_head(u) && !head_embedding.empty());
  }
  // The cost model's kept_through_backward (simulator.cpp): without resharding every gathered
  // unit stays for the backward; with it the last unit, and FSDP1's root, stay.
  bool kept(std::int64_t u) const {
    return !o.spec.reshard_after_forward || is_head(u) || (o.spec.keep_root_unsharded && u == 0);
  }

  // The gathered buffer is written by the all-gather stream and read by the compute stream, which
  // waits for it in wait_for_gathers.
  void gather_into(std::int64_t u, Buffer& out) {
    const auto& us = shape(u);
    be.allocate_on(shard.get());
    out = alloc.allocate_uninitialized<float>(MemoryCategory::buffers, us.padded);
    be.allocate_on(nullptr);
    be.record_use(out.data(), nullptr);
    shard->all_gather(unit(u).params.data(), out.data(), static_cast<std::size_t>(us.chunk), kF32);
  }
  // Before unit u's compute: the gathers queued so far (u's among them; later prefetches are
  // queued after this) are done.
  void wait_for_gathers(std::int64_t u) {
    if (needs_gather(u))
      be.wait(nullptr, shard.get());
  }
  void acquire(std::int64_t u) {
    if (shape(u).params_sharded && unit(u).gathered.empty())
      gather_into(u, unit(u).gathered);
    if (is_head(u) && tied() && shape(0).params_sharded && head_embedding.empty())
      gather_into(0, head_embedding);
  }
  void release(std::int64_t u) {
    unit(u).gathered.reset();
    if (is_head(u))
      head_embedding.reset();
  }
  std::span<const float> params_for(std::int64_t u) {
    return shape(u).params_sharded ? unit(u).gathered.span() : unit(u).params.span();
  }
  std::span<const float> embedding_for_head() {
    if (!tied())
      return {};
    return shape(0).params_sharded ? head_embedding.span() : unit(0).params.span();
  }

  // Plan-order prefetch (EngineOptions::prefetch_as_planned): the next units the limiter allows.
  void prefetch_forward(std::int64_t u) {
    const int limit = o.spec.max_inflight_allgathers;
    for (int j = 1; j <= fwd_prefetch; ++j) {
      const std::int64_t v = u + j;
      if (v >= unit_count())
        break;
      if (!needs_gather(v) || alive(v))
        continue;
      const std::int64_t back = v - limit; // must have been freed (rate limiter)
      if (back >= 0 && !kept(back) && alive(back))
        break;
      acquire(v);
    }
  }
  void prefetch_backward(std::int64_t u) {
    const int limit = o.spec.max_inflight_allgathers;
    for (int j = 1; j <= bwd_prefetch; ++j) {
      const std::int64_t v = u - j;
      if (v < 0)
        break;
      if (!needs_gather(v) || alive(v))
        continue;
      if (v + limit <= u)
        break; // unit v + limit has not finished its backward yet
      acquire(v);
    }
  }

  void ensure_grad_target(std::int64_t u) {
    auto& un = unit(u);
    if (o.spec.shard_gradients) {
      if (un.fresh.empty())
        un.fresh = alloc.allocate<float>(MemoryCategory::gradients, shape(u).padded);
    } else if (un.grads.empty()) {
      un.grads = alloc.allocate<float>(MemoryCategory::gradients, sl.whole_elements(u, o.spec));
    }
  }
  std::span<float> grad_span(std::int64_t u) {
    return o.spec.shard_gradients ? unit(u).fresh.span() : unit(u).grads.span();
  }

  // Tells the watchdog what the step does now: "step 2 forward unit 3" ("step 2 micro-batch 1
  // forward unit 3" with gradient accumulation). Units are whole blocks: the formatting is noise.
  void phase(const char* part, std::int64_t u = -1, std::int64_t mb = -1) {
    if (o.watchdog == nullptr)
      return;
    std::string text = fmt::format("step {}", step_count);
    if (mb >= 0 && o.grad_accumulation > 1)
      text += fmt::format(" micro-batch {}", mb + 1);
    text += fmt::format(" {}", part);
    if (u >= 0)
      text += fmt::format(" unit {}", u);
    o.watchdog->set_phase(text);
  }

  template <class F> void timed(Part part, F&& f) {
    be.begin(part);
    f();
    be.end(part);
  }
  template <class F> void timed_compute(Part part, F&& f) {
    const double c0 = thread_cpu_seconds();
    timed(part, f);
    compute_cpu_s += thread_cpu_seconds() - c0;
  }

  // Adds the kept chunk into this rank's block of the reduce input, so that the reduce-scatter's
  // sum is the accumulated gradient (the reduce overwrites its output). With replicas only the
  // first replica adds it: the replica all-reduce then sums it once.
  void accumulate_into_input(std::int64_t u, float* input) {
    if (sl.replica_rank != 0)
      return;
    be.wait(nullptr, reduce.get()); // the kept chunk is the previous micro-batch's reduction
    if (replica)
      be.wait(nullptr, replica.get());
    timed(Part::copy, [&] {
      be.add(input + sl.chunk_begin(u), unit(u).grad_shard.data(), shape(u).chunk);
    });
  }

  // Before a reduction reads its input: the compute that wrote it is done. (A buffer freed before
  // the step's end that a reduction read, the per-micro-batch gradient, is marked as used by the
  // reduce stream where it is freed, reduce_unit; the others live until the step's end, when every
  // stream has been waited for.)
  void ready_for_reduce() { be.wait(reduce.get(), nullptr); }
  // A reduction's output that the compute stream reads later.
  Buffer reduce_output(MemoryCategory category, std::int64_t elements) {
    be.allocate_on(reduce.get());
    auto out = alloc.allocate<float>(category, elements);
    be.allocate_on(nullptr);
    be.record_use(out.data(), nullptr);
    if (replica)
      be.record_use(out.data(), replica.get());
    return out;
  }
  // The replica group's all-reduce of what the shard group's reduction produced.
  void replica_all_reduce(float* data, std::size_t count) {
    if (!replica)
      return;
    be.wait(replica.get(), reduce.get());
    replica->all_reduce(data, data, count, kF32);
  }

  // Reduces unit u's gradient held in `input` (padded elements when the optimizer is sharded,
  // whole otherwise). `input` may be the unit's own gradient buffer or a bucket region.
  void reduce_from(std::int64_t u, float* input) {
    const auto& us = shape(u);
    auto& un = unit(u);
    const auto c = static_cast<std::size_t>(us.chunk);
    if (o.spec.shard_optimizer && o.spec.shard_gradients) {
      if (un.grad_shard.empty())
        un.grad_shard = reduce_output(MemoryCategory::gradients, us.chunk);
      else
        accumulate_into_input(u, input);
      ready_for_reduce();
      reduce->reduce_scatter(input, un.grad_shard.data(), c, kF32);
      replica_all_reduce(un.grad_shard.data(), c);
    } else if (o.spec.shard_optimizer) {
      // Whole gradients, sharded optimizer (ZeRO-1): this rank's chunk of the whole buffer gets
      // the reduced chunk. The output must not overlap the input: a bucket region, or a transient.
      float* mine = un.grads.data() + sl.chunk_begin(u);
      ready_for_reduce();
      if (input != un.grads.data()) {
        reduce->reduce_scatter(input, mine, c, kF32);
        replica_all_reduce(mine, c);
      } else {
        auto out = reduce_output(MemoryCategory::buffers, us.chunk);
        reduce->reduce_scatter(input, out.data(), c, kF32);
        replica_all_reduce(out.data(), c);
        be.wait(nullptr, replica ? replica.get() : reduce.get());
        timed(Part::copy, [&] { be.copy(mine, out.data(), us.chunk); });
      }
    } else {
      // All-reduce in buckets of reduce_bucket_bytes (DDP's bucket_cap_mb; the cost model's
      // bucketed(): one collective per full bucket and one for the rest).
      const double dtype = costmodel::dtype_bytes(o.spec.reduce_dtype);
      const std::int64_t per =
          o.spec.reduce_bucket_bytes > 0
              ? std::max<std::int64_t>(
                    1, static_cast<std::int64_t>(o.spec.reduce_bucket_bytes / dtype))
              : us.size;
      ready_for_reduce();
      for (std::int64_t begin = 0; begin < us.size; begin += per) {
        const auto n = static_cast<std::size_t>(std::min(per, us.size - begin));
        reduce->all_reduce(input + begin, input + begin, n, kF32);
        replica_all_reduce(input + begin, n);
      }
    }
  }

  // Waits until the last reductions that read bucket i are done, before it is filled again.
  void wait_for_bucket(std::size_t i) {
    if (!bucket_in_flight[i])
      return;
    be.wait(nullptr, reduce.get());
    if (replica)
      be.wait(nullptr, replica.get());
    bucket_in_flight[i] = false;
  }

  void flush_bucket() {
    const auto i = static_cast<std::size_t>(bucket_index);
    for (const auto& p : pending)
      reduce_from(p.unit, buckets[i].data() + p.offset);
    bucket_in_flight[i] = true;
    if (!o.spec.shard_optimizer) { // all-reduced in the bucket: copy the sums back
      wait_for_bucket(i);
      for (const auto& p : pending)
        timed(Part::copy, [&] {
          be.copy(unit(p.unit).grads.data(), buckets[i].data() + p.offset, shape(p.unit).size);
        });
    }
    pending.clear();
    bucket_used = 0;
    pending_bytes = 0;
    if (!buckets[1].empty())
      bucket_index ^= 1;
  }

  // After unit u's backward, on a micro-batch that reduces.
  void reduce_unit(std::int64_t u) {
    auto& un = unit(u);
    const auto& us = shape(u);
    float* source = o.spec.shard_gradients ? un.fresh.data() : un.grads.data();
    const std::int64_t len = o.spec.shard_gradients ? us.padded : sl.whole_elements(u, o.spec);
    if (o.spec.contiguous_grad_bucket) {
      // DeepSpeed's contiguous gradients: the unit's gradient is copied into the bucket and its
      // own buffer freed; the bucket is reduced when it holds reduce_bucket_bytes (counted in the
      // reduce dtype, as the cost model counts) or at the first unit. A unit larger than the
      // whole bucket is reduced from its own buffer.
      const std::int64_t capacity = buckets[0].size();
      if (len > capacity) {
        flush_bucket();
        reduce_from(u, source);
      } else {
        if (bucket_used + len > capacity)
          flush_bucket();
        wait_for_bucket(static_cast<std::size_t>(bucket_index));
        auto& bucket = buckets[static_cast<std::size_t>(bucket_index)];
        timed(Part::copy, [&] { be.copy(bucket.data() + bucket_used, source, len); });
        pending.push_back({u, bucket_used});
        bucket_used += len;
        pending_bytes += static_cast<double>(us.size) * costmodel::dtype_bytes(o.spec.reduce_dtype);
      }
      release_fresh(un);
      if (!pending.empty() && (pending_bytes >= o.spec.reduce_bucket_bytes || u == 0))
        flush_bucket();
      return;
    }
    if (o.spec.grad_bucket_copy) {
      // torch DDP without gradient_as_bucket_view: gradients are copied into the bucket, reduced
      // there, and the reduced values copied back into the gradients.
      // The copies back wait for every reduction, after the backward (copy_back_buckets), so
      // that the compute does not wait for each bucket's reduction in turn.
      float* region = ddp_bucket.data() + ddp_offset[static_cast<std::size_t>(u)];
      timed(Part::copy, [&] { be.copy(region, source, us.size); });
      reduce_from(u, region);
    } else {
      reduce_from(u, source);
    }
    release_fresh(un);
  }

  // Frees a unit's per-micro-batch gradient (sharded gradients), which a reduction may still be
  // reading on its stream: the memory is not handed out again before that is done.
  void release_fresh(Unit& un) {
    if (un.fresh.empty())
      return;
    be.record_use(un.fresh.data(), reduce.get());
    un.fresh.reset();
  }

  double micro_batch(std::int64_t mb, bool reduce_now) {
    const std::int64_t U = unit_count();
    const std::int64_t L = U - 2;
    const auto& b = o.micro_batch;
    const std::int64_t global_batch = b.batch * o.grad_accumulation * sl.world;
    const std::int64_t first =
        (step_count - 1) * global_batch + (mb * sl.world + world_rank()) * b.batch;
    auto tokens = synthetic_sequences(alloc, o.seed, first, b, o.model.vocab);

    // ---- forward
    std::vector<BlockActivations<float>> saved(static_cast<std::size_t>(L));
    TrackedBuffer<float> x;
    std::optional<HeadForward<float>> head;
    for (std::int64_t u = 0; u < U; ++u) {
      phase("forward", u, mb);
      acquire(u);
      wait_for_gathers(u);
      prefetch_forward(u);
      timed_compute(Part::forward, [&] {
        if (u == 0) {
          x = model.forward_embedding(params_for(u), tokens.inputs.span(), b);
        } else if (u < U - 1) {
          auto f = model.forward_block(params_for(u), std::move(x), b, o.checkpointing);
          x = std::move(f.output);
          saved[static_cast<std::size_t>(u - 1)] = std::move(f.saved);
        } else {
          head.emplace(model.forward_head(params_for(u), embedding_for_head(), std::move(x),
                                          tokens.targets.span(), b));
        }
      });
      if (needs_gather(u) && !kept(u))
        release(u);
    }
    const double loss = head->loss;

    // ---- backward
    const double scale = 1.0 / (static_cast<double>(o.grad_accumulation) * sl.world);
    TrackedBuffer<float> dx;
    for (std::int64_t u = U - 1; u >= 0; --u) {
      phase("backward", u, mb);
      acquire(u);
      wait_for_gathers(u);
      prefetch_backward(u);
      ensure_grad_target(u);
      if (is_head(u) && tied())
        ensure_grad_target(0); // the head adds into the embedding's
      timed_compute(Part::backward, [&] {
        if (is_head(u)) {
          dx = model.backward_head(params_for(u), embedding_for_head(), std::move(head->saved),
                                   tokens.targets.span(), grad_span(u),
                                   tied() ? grad_span(0) : std::span<float>{}, scale);
        } else if (u > 0) {
          dx =
              model.backward_block(params_for(u), std::move(saved[static_cast<std::size_t>(u - 1)]),
                                   std::move(dx), grad_span(u));
        } else {
          model.backward_embedding(tokens.inputs.span(), std::move(dx), grad_span(0), b);
        }
      });
      if (needs_gather(u))
        release(u);
      if (reduce_now)
        reduce_unit(u);
    }
    return loss;
  }

  // The reductions are done before the compute reads what they wrote.
  void wait_for_reductions() {
    be.wait(nullptr, reduce.get());
    if (replica)
      be.wait(nullptr, replica.get());
  }

  // grad_bucket_copy without a sharded optimizer: the all-reduced sums back into the gradients
  // (a reduce-scatter wrote its chunk in place otherwise).
  void copy_back_buckets() {
    if (!o.spec.grad_bucket_copy || o.spec.shard_optimizer)
      return;
    for (std::int64_t u = 0; u < unit_count(); ++u)
      timed(Part::copy, [&] {
        be.copy(unit(u).grads.data(), ddp_bucket.data() + ddp_offset[static_cast<std::size_t>(u)],
                shape(u).size);
      });
  }

  void optimizer_step() {
    phase("optimizer");
    const auto& spec = o.spec;
    for (std::int64_t u = 0; u < unit_count(); ++u) {
      auto& un = unit(u);
      const auto& us = shape(u);
      const std::int64_t n = spec.shard_optimizer ? us.chunk : us.size;
      const std::int64_t begin = spec.shard_optimizer ? sl.chunk_begin(u) : 0;
      float* p = us.params_sharded ? un.params.data() : un.params.data() + begin;
      const float* gr = spec.shard_gradients ? un.grad_shard.data() : un.grads.data() + begin;
      if (un.exp_avg.size() != n)
        throw std::logic_error(fmt::format("unit {}: {} optimizer elements for {} parameters", u,
                                           un.exp_avg.size(), n));
      be.adamw_step(p, gr, un.exp_avg.data(), un.exp_avg_sq.data(), n, step_count, o.adamw);
    }
  }

  // Sharded optimizer, parameters not partitioned (ZeRO-1/2, and units kept whole under ZeRO-3's
  // persistence threshold): every rank all-gathers the updated chunks in place.
  void gather_updated_parameters() {
    if (!o.spec.shard_optimizer)
      return;
    phase("parameter all-gather");
    be.wait(shard.get(), nullptr); // after the optimizer's updates
    for (std::int64_t u = 0; u < unit_count(); ++u) {
      const auto& us = shape(u);
      if (us.params_sharded)
        continue;
      float* p = unit(u).params.data();
      shard->all_gather(p + sl.chunk_begin(u), p, static_cast<std::size_t>(us.chunk), kF32);
    }
  }
};

OwnedGroups make_groups(comm::Communicator& world, const costmodel::ShardingSpec& spec,
                        bool separate_reduce_stream) {
  OwnedGroups g;
  const int n = world.size(), r = world.rank(), S = spec.group(n);
  if (S < 1 || S > n || n % S != 0)
    throw std::invalid_argument(
        fmt::format("a shard group of {} ranks does not divide {} ranks", S, n));
  if (S < n) {
    g.shard = world.split(r / S, r % S);
    g.replica = world.split(r % S, r / S);
  }
  g.groups = {&world, g.shard ? g.shard.get() : &world, g.replica.get(), false, nullptr};
  if (separate_reduce_stream) {
    g.shard_reduce = g.groups.shard->split(0, g.groups.shard->rank());
    g.groups.shard_reduce = g.shard_reduce.get();
  }
  return g;
}

ShardingEngine::ShardingEngine(EngineOptions options, TrackedAllocator& allocator,
                               EngineGroups groups)
    : s_(std::make_unique<State>(std::move(options), allocator, groups)) {
  auto& s = *s_;
  const auto& spec = s.o.spec;
  if (groups.world == nullptr)
    throw std::invalid_argument("the world group is missing");
  if (spec.shard_parameters && !spec.shard_gradients)
    throw std::invalid_argument(
        "shard_parameters needs shard_gradients (no framework does otherwise)");
  if (spec.shard_gradients && !spec.shard_optimizer)
    throw std::invalid_argument(
        "shard_gradients needs shard_optimizer (no framework does otherwise)");
  if (s.o.grad_accumulation < 1)
    throw std::invalid_argument(fmt::format("{} micro-batches per step", s.o.grad_accumulation));
  if (s.o.micro_batch.batch < 1 || s.o.micro_batch.seq < 1)
    throw std::invalid_argument("the micro-batch is empty");
  const auto& layout = s.model.layout();
  s.sl = make_shard_layout(layout, spec, groups.world->size(), groups.world->rank());
  check_group(groups.shard, s.sl.group, s.sl.shard_rank, "shard");
  if (s.sl.replicas > 1)
    check_group(groups.replica, s.sl.replicas, s.sl.replica_rank, "replica");
  s.shard = std::make_unique<TimedCommunicator>(*groups.shard, s.stats);
  if (groups.shard_reduce != nullptr) {
    check_group(groups.shard_reduce, s.sl.group, s.sl.shard_rank, "shard reduce");
    s.reduce = std::make_unique<TimedCommunicator>(*groups.shard_reduce, s.stats);
  } else {
    s.reduce = std::make_unique<TimedCommunicator>(*groups.shard, s.stats);
  }
  if (s.sl.replicas > 1)
    s.replica = std::make_unique<TimedCommunicator>(*groups.replica, s.stats);

  if (s.o.prefetch_as_planned && spec.shard_parameters) {
    s.fwd_prefetch = spec.forward_prefetch;
    s.bwd_prefetch = spec.backward_prefetch;
    // DeepSpeed: as many blocks ahead as stage3_prefetch_bucket_size elements hold (at least one),
    // as the cost model derives it.
    const double block = static_cast<double>(layout.block().size);
    if (spec.prefetch_bucket_elems > 0 && block > 0)
      s.fwd_prefetch = std::max(1, static_cast<int>(spec.prefetch_bucket_elems / block));
  }

  // ---- state present before the first step: parameters, optimizer states, persistent buffers.
  const std::int64_t U = layout.unit_count();
  s.units.resize(static_cast<std::size_t>(U));
  for (std::int64_t u = 0; u < U; ++u) {
    auto& un = s.unit(u);
    const auto& us = s.shape(u);
    const std::int64_t n = us.params_sharded ? us.chunk : s.sl.whole_elements(u, spec);
    un.params = allocator.allocate<float>(MemoryCategory::parameters, n);
    const std::int64_t first = us.params_sharded ? s.sl.chunk_begin(u) : 0;
    if (allocator.host_accessible()) {
      init_unit_params<float>(layout, u, s.o.seed, first, un.params.span());
    } else { // drawn on the host, then written into the device's memory
      std::vector<float> host(static_cast<std::size_t>(n));
      init_unit_params<float>(layout, u, s.o.seed, first, host);
      allocator.source().write(un.params.data(), host.data(),
                               n * static_cast<std::int64_t>(sizeof(float)));
    }
  }
  for (std::int64_t u = 0; u < U; ++u) {
    auto& un = s.unit(u);
    const auto& us = s.shape(u);
    const std::int64_t n = spec.shard_optimizer ? us.chunk : us.size;
    un.exp_avg = allocator.allocate<float>(MemoryCategory::optimizer_states, n);
    un.exp_avg_sq = allocator.allocate<float>(MemoryCategory::optimizer_states, n);
  }
  if (spec.grad_bucket_copy) {
    std::int64_t total = 0;
    for (std::int64_t u = 0; u < U; ++u) {
      s.ddp_offset.push_back(total);
      total += s.sl.whole_elements(u, spec);
    }
    s.ddp_bucket = allocator.allocate<float>(MemoryCategory::buffers, total);
  }
  if (spec.contiguous_grad_bucket) {
    const auto floats = static_cast<std::int64_t>(spec.reduce_bucket_bytes / sizeof(float));
    s.buckets[0] = allocator.allocate<float>(MemoryCategory::buffers, floats);
    if (spec.flat_grad_partition)
      s.buckets[1] = allocator.allocate<float>(MemoryCategory::buffers, floats);
  }
}

ShardingEngine::~ShardingEngine() = default;

StepReport ShardingEngine::step() {
  auto& s = *s_;
  s.stats = {};
  s.compute_cpu_s = 0;
  (void)s.be.take_seconds();
  ++s.step_count;
  StepReport r;
  r.step = s.step_count;
  const auto t0 = Clock::now();
  const double c0 = thread_cpu_seconds();
  double loss_sum = 0;
  const std::int64_t gas = s.o.grad_accumulation;
  for (std::int64_t mb = 0; mb < gas; ++mb)
    loss_sum += s.micro_batch(mb, s.o.spec.shard_gradients || mb == gas - 1);
  s.copy_back_buckets();
  s.wait_for_reductions();
  s.timed(State::Part::optimizer, [&] { s.optimizer_step(); });
  s.gather_updated_parameters();
  // Everything queued is done (a GPU's streams; nothing to wait for on the host).
  s.phase("end of the step");
  for (auto* c : {s.shard.get(), s.reduce.get(), s.replica.get()})
    if (c != nullptr)
      c->synchronize();
  s.be.synchronize();
  // zero_grad(set_to_none=True): the gradients kept through the step are released.
  for (auto& un : s.units) {
    un.grads.reset();
    un.grad_shard.reset();
  }
  r.step_s = seconds_since(t0);
  r.step_cpu_s = thread_cpu_seconds() - c0;
  r.compute_cpu_s = s.compute_cpu_s;
  const auto parts = s.be.take_seconds();
  r.forward_s = parts.forward;
  r.backward_s = parts.backward;
  r.compute_s = parts.forward + parts.backward;
  r.optimizer_s = parts.optimizer;
  r.copy_s = parts.copy;
  auto waited = [&](const comm::Communicator* c) {
    const auto it = parts.comm_waits.find(c);
    return c != nullptr && it != parts.comm_waits.end() ? it->second : 0.0;
  };
  r.gather_wait_s = waited(s.shard.get());
  r.reduce_wait_s = waited(s.reduce.get());
  r.replica_wait_s = waited(s.replica.get());
  r.comm_wait_s = r.gather_wait_s + r.reduce_wait_s + r.replica_wait_s;
  r.collectives = s.stats;
  // The loss of the global batch (outside the step's time), in memory the world's collectives use.
  double local = loss_sum / static_cast<double>(gas);
  if (s.g.stand_in) {
    r.loss = local;
  } else {
    s.phase("loss");
    auto buffer = s.g.world->allocate(sizeof(double));
    buffer->copy_from_host(&local, sizeof(double));
    s.g.world->all_reduce(buffer->data(), buffer->data(), 1, comm::DataType::f64);
    s.g.world->synchronize();
    double sum = 0;
    buffer->copy_to_host(&sum, sizeof(double));
    r.loss = sum / s.sl.world;
  }
  return r;
}

std::vector<float> ShardingEngine::full_parameters(std::int64_t unit) {
  auto& s = *s_;
  const auto& us = s.shape(unit);
  auto& un = s.unit(unit);
  std::vector<float> out(static_cast<std::size_t>(us.padded));
  s.be.synchronize();
  if (us.params_sharded) {
    const auto bytes = static_cast<std::size_t>(us.padded) * sizeof(float);
    auto gathered = s.g.shard->allocate(bytes);
    s.g.shard->all_gather(un.params.data(), gathered->data(), static_cast<std::size_t>(us.chunk),
                          kF32);
    s.g.shard->synchronize();
    gathered->copy_to_host(out.data(), bytes);
  } else {
    s.alloc.source().read(out.data(), un.params.data(),
                          us.size * static_cast<std::int64_t>(sizeof(float)));
  }
  out.resize(static_cast<std::size_t>(us.size));
  return out;
}

const GptLayout& ShardingEngine::layout() const {
  return s_->model.layout();
}
const ShardLayout& ShardingEngine::shards() const {
  return s_->sl;
}
const EngineOptions& ShardingEngine::options() const {
  return s_->o;
}
std::int64_t ShardingEngine::steps_done() const {
  return s_->step_count;
}

ShardingEngine::UnitState ShardingEngine::unit_state(std::int64_t unit) {
  auto& s = *s_;
  auto& un = s.unit(unit);
  const bool chunked_params = s.shape(unit).params_sharded;
  return {un.params.span(), chunked_params ? s.sl.chunk_begin(unit) : 0, un.exp_avg.span(),
          un.exp_avg_sq.span(), s.o.spec.shard_optimizer ? s.sl.chunk_begin(unit) : 0};
}

void ShardingEngine::set_steps_done(std::int64_t steps) {
  if (steps < 0)
    throw std::invalid_argument(fmt::format("{} steps done", steps));
  s_->step_count = steps;
}
int ShardingEngine::forward_prefetch() const {
  return s_->fwd_prefetch;
}
int ShardingEngine::backward_prefetch() const {
  return s_->bwd_prefetch;
}

} // namespace shardplan::executor
