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

#include "executor/host_offload.hpp"
#include "executor/param_init.hpp"
#include "executor/synthetic_data.hpp"
#include "executor/timed_communicator.hpp"

namespace shardplan::executor {
namespace {

using Clock = std::chrono::steady_clock;

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

struct ShardingEngine::Impl {
  virtual ~Impl() = default;
  virtual StepReport step() = 0;
  virtual std::vector<float> full_parameters(std::int64_t unit) = 0;
  virtual const GptLayout& layout() const = 0;
  virtual const ShardLayout& shards() const = 0;
  virtual const EngineOptions& options() const = 0;
  virtual std::int64_t steps_done() const = 0;
  virtual UnitState unit_state(std::int64_t unit) = 0;
  virtual void set_steps_done(std::int64_t steps) = 0;
  virtual int forward_prefetch() const = 0;
  virtual int backward_prefetch() const = 0;
};

namespace {

// torch.cuda.amp.GradScaler's defaults (torch/amp/grad_scaler.py): growth_factor 2,
// backoff_factor 0.5, growth_interval 2000 (init_scale 2^16: EngineOptions).
constexpr std::int64_t kLossScaleGrowthInterval = 2000;

template <class S> Backend<S>* backend_of(const EngineOptions& o) {
  if constexpr (std::is_same_v<S, float>)
    return o.backend;
  else if constexpr (std::is_same_v<S, bf16>)
    return o.backend_bf16;
  else
    return o.backend_f16;
}

// S: the compute type; A = accum_t<S>: master weights, optimizer states, fp32 gradients.
template <class S>
struct State final : ShardingEngine::Impl {
  using A = accum_t<S>;
  static constexpr bool kMixed = !std::is_same_v<S, A>;
  static constexpr comm::DataType kS = data_type_v<S>;
  static constexpr comm::DataType kA = data_type_v<A>;

  struct Unit {
    TrackedBuffer<A> params; // fp32 parameters at rest (chunk or whole); DeepSpeed: the master
    TrackedBuffer<S> low;    // DeepSpeed's S parameters at rest (chunk or whole)
    TrackedBuffer<A> exp_avg; // chunk (sharded optimizer) or whole
    TrackedBuffer<A> exp_avg_sq;
    // Whole gradient (unsharded gradients): alive from first use to step end, fp32 or S.
    TrackedBuffer<A> grads;
    TrackedBuffer<S> low_grads;
    // S gradient of one micro-batch: sharded gradients' full gradient; with fp32 whole gradients
    // the unit's backward output, widened into them after the backward.
    TrackedBuffer<S> fresh;
    TrackedBuffer<A> grad_shard;     // reduced chunk (sharded gradients), fp32 or
    TrackedBuffer<S> low_grad_shard; // ... S: from its first reduce to step end
    TrackedBuffer<S> gathered;       // all-gathered parameters, or DDP's S copy, while in use
    // Optimizer offload where the device keeps the fp32 parameters (PyTorch's flavours, fp32):
    // the host's fp32 copy of this rank's part of them, AdamW's master (host_offload.hpp).
    TrackedBuffer<A> host_master;
  };
  struct Pending {
    std::int64_t unit;
    std::int64_t offset; // in the current contiguous bucket
  };
  // A reduced chunk in S waiting to be added into the unit's fp32 chunk.
  struct Widen {
    std::int64_t unit;
    TrackedBuffer<S> chunk;
  };

  State(EngineOptions opts, TrackedAllocator& a, EngineGroups groups)
      : o(std::move(opts)),
        alloc(a),
        g(groups),
        host_backend(backend_of<S>(o) ? nullptr : std::make_unique<HostBackend<S>>(&a.source())),
        be(backend_of<S>(o) ? *backend_of<S>(o) : *host_backend),
        model(o.model, a, o.model_options, &be) {
    init();
  }

  using Part = typename Backend<S>::Part;

  EngineOptions o;
  TrackedAllocator& alloc;
  EngineGroups g;
  std::unique_ptr<Backend<S>> host_backend; // when none is given
  Backend<S>& be;
  GptModel<S> model;
  PrecisionPolicy policy;
  ShardLayout sl;
  CollectiveStats stats; // of the current step
  // The shard group's all-gathers, its reductions (the same group, on a GPU its own stream) and
  // the replica group's all-reduce; each counted in `stats`.
  std::unique_ptr<TimedCommunicator> shard, reduce, replica;
  // Offloaded states (host_offload.hpp): a pool of its own, not the device's; declared before the
  // units so that it outlives their buffers.
  OffloadPolicy offload;
  TrackedAllocator host_pool;
  std::vector<Unit> units;
  TrackedBuffer<S> head_embedding; // tied head: the embedding gathered (or copied) again
  TrackedBuffer<A> ddp_bucket;     // grad_bucket_copy: every unit's gradient, concatenated
  std::vector<std::int64_t> ddp_offset;
  std::array<TrackedBuffer<S>, 2> buckets; // contiguous_grad_bucket (two with flat_grad_partition)
  std::array<bool, 2> bucket_in_flight{};  // reduced from and not waited for since
  int bucket_index = 0;
  std::int64_t bucket_used = 0; // elements
  double pending_bytes = 0;     // the cost model's count: elements × reduce dtype bytes
  std::vector<Pending> pending;
  std::vector<Widen> widen_pending;
  std::int64_t step_count = 0;
  int fwd_prefetch = 0, bwd_prefetch = 0;
  double compute_cpu_s = 0;
  double loss_scale = 1;
  std::int64_t good_steps = 0; // since the loss scale last changed

  std::int64_t unit_count() const { return static_cast<std::int64_t>(units.size()); }
  const UnitShards& shape(std::int64_t u) const { return sl.units[static_cast<std::size_t>(u)]; }
  Unit& unit(std::int64_t u) { return units[static_cast<std::size_t>(u)]; }
  bool tied() const { return o.model.tied_embeddings; }
  bool is_head(std::int64_t u) const { return u == unit_count() - 1; }
  int world_rank() const { return sl.replica_rank * sl.group + sl.shard_rank; }
  bool low_whole() const { return policy.low_whole_grads; }

  // A unit needs a gather before it runs: its parameters are partitioned, or it is a tied head
  // whose output matrix lives in the partitioned embedding unit (the cost model's head gather
  // includes the embedding matrix).
  bool needs_gather(std::int64_t u) const {
    return shape(u).params_sharded || (is_head(u) && tied() && shape(0).params_sharded);
  }
  // DDP under autocast: the unit computes from an S copy of its fp32 parameters.
  bool needs_copy(std::int64_t u) const { return policy.autocast_copies && !needs_gather(u); }
  bool alive(std::int64_t u) {
    return !unit(u).gathered.empty() || (is_head(u) && !head_embedding.empty());
  }
  // The cost model's kept_through_backward (simulator.cpp): without resharding every gathered
  // unit stays for the backward; with it the last unit, and FSDP1's root, stay.
  bool kept(std::int64_t u) const {
    return !o.spec.reshard_after_forward || is_head(u) || (o.spec.keep_root_unsharded && u == 0);
  }

  // The gathered buffer is written by the all-gather stream and read by the compute stream, which
  // waits for it in wait_for_gathers. An fp32 chunk is first cast to S (FSDP's MixedPrecision
  // param_dtype): a transient the gather stream reads once the compute stream has written it.
  void gather_into(std::int64_t u, TrackedBuffer<S>& out) {
    if (offload.params && shape(u).params_sharded)
      return gather_offloaded(u, out);
    const auto& us = shape(u);
    auto& un = unit(u);
    const auto chunk = static_cast<std::size_t>(us.chunk);
    TrackedBuffer<S> cast;
    const S* source = nullptr;
    if constexpr (kMixed) {
      if (policy.low_params) {
        source = un.low.data();
      } else {
        cast = alloc.allocate_uninitialized<S>(MemoryCategory::buffers, us.chunk);
        be.narrow(cast.data(), un.params.data(), us.chunk);
        be.wait(shard.get(), nullptr);
        source = cast.data();
      }
    } else {
      source = un.params.data();
    }
    be.allocate_on(shard.get());
    out = alloc.allocate_uninitialized<S>(MemoryCategory::buffers, us.padded);
    be.allocate_on(nullptr);
    be.record_use(out.data(), nullptr);
    shard->all_gather(source, out.data(), chunk, kS);
    if (!cast.empty()) {
      be.record_use(cast.data(), shard.get());
      cast.reset();
    }
  }
  // DDP under autocast: the S copy of unit u's fp32 parameters.
  void copy_into(std::int64_t u, TrackedBuffer<S>& out) {
    const std::int64_t n = sl.whole_elements(u, o.spec);
    out = alloc.allocate_uninitialized<S>(MemoryCategory::buffers, n);
    be.narrow(out.data(), unit(u).params.data(), n);
  }
  // Before unit u's compute: the gathers queued so far (u's among them; later prefetches are
  // queued after this) are done.
  void wait_for_gathers(std::int64_t u) {
    if (needs_gather(u))
      be.wait(nullptr, shard.get());
  }
  // Unit u's parameters for its compute. The embedding's backward reads none: DDP's S copy of it
  // exists for the forward only (the cost model counts none: autocast does not cast the lookup).
  void acquire(std::int64_t u, bool backward = false) {
    if (shape(u).params_sharded && unit(u).gathered.empty())
      gather_into(u, unit(u).gathered);
    if (is_head(u) && tied() && shape(0).params_sharded && head_embedding.empty())
      gather_into(0, head_embedding);
    if (needs_copy(u) && unit(u).gathered.empty() && !(backward && u == 0)) {
      copy_into(u, unit(u).gathered);
      if (is_head(u) && tied() && head_embedding.empty())
        copy_into(0, head_embedding);
    }
  }
  void release(std::int64_t u) {
    unit(u).gathered.reset();
    if (is_head(u))
      head_embedding.reset();
  }
  std::span<const S> params_for(std::int64_t u) {
    auto& un = unit(u);
    if (needs_gather(u) && shape(u).params_sharded)
      return un.gathered.span();
    if (needs_copy(u))
      return un.gathered.span();
    if constexpr (kMixed)
      return un.low.span();
    else
      return un.params.span();
  }
  std::span<const S> embedding_for_head() {
    if (!tied())
      return {};
    if (shape(0).params_sharded || policy.autocast_copies)
      return head_embedding.span();
    if constexpr (kMixed)
      return unit(0).low.span();
    else
      return unit(0).params.span();
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

  // The model adds a unit's gradient into an S buffer: the kept whole gradient when it is S, else
  // `fresh` (sharded gradients' per-micro-batch gradient, or the transient widened into fp32
  // whole gradients).
  bool widens_whole() const { return kMixed && !o.spec.shard_gradients && !low_whole(); }
  void ensure_grad_target(std::int64_t u) {
    auto& un = unit(u);
    if (o.spec.shard_gradients) {
      if (un.fresh.empty())
        un.fresh = alloc.allocate<S>(MemoryCategory::gradients, shape(u).padded);
      return;
    }
    const std::int64_t n = sl.whole_elements(u, o.spec);
    if (low_whole()) {
      if (un.low_grads.empty())
        un.low_grads = alloc.allocate<S>(MemoryCategory::gradients, n);
      return;
    }
    if (un.grads.empty())
      un.grads = alloc.allocate<A>(MemoryCategory::gradients, n);
    if (widens_whole() && un.fresh.empty())
      un.fresh = alloc.allocate<S>(MemoryCategory::gradients, n);
  }
  std::span<S> grad_span(std::int64_t u) {
    auto& un = unit(u);
    if (o.spec.shard_gradients || widens_whole())
      return un.fresh.span();
    if (low_whole())
      return un.low_grads.span();
    if constexpr (kMixed)
      return {};
    else
      return un.grads.span();
  }
  // After unit u's backward: the S gradient the model wrote, widened into the fp32 whole gradient.
  // A tied head also added into the embedding's transient, widened after the embedding's backward.
  void widen_whole(std::int64_t u) {
    if (!widens_whole())
      return;
    auto& un = unit(u);
    timed(Part::copy, [&] { be.widen_add(un.grads.data(), un.fresh.data(), un.fresh.size()); });
    un.fresh.reset();
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
  // first replica adds it: the replica all-reduce then sums it once. On every replica the
  // reduce-scatter about to overwrite the kept chunk waits for the previous micro-batch's replica
  // all-reduce of it (write after write across the two streams).
  void accumulate_into_input(std::int64_t u, S* input, const S* kept_chunk) {
    if (replica)
      be.wait(reduce.get(), replica.get());
    if (sl.replica_rank != 0)
      return;
    be.wait(nullptr, reduce.get()); // the kept chunk is the previous micro-batch's reduction
    if (replica)
      be.wait(nullptr, replica.get());
    timed(Part::copy, [&] { be.add(input + sl.chunk_begin(u), kept_chunk, shape(u).chunk); });
  }

  // Before a reduction reads its input: the compute that wrote it is done. (A buffer freed before
  // the step's end that a reduction read, the per-micro-batch gradient, is marked as used by the
  // reduce stream where it is freed, reduce_unit; the others live until the step's end, when every
  // stream has been waited for.)
  void ready_for_reduce() { be.wait(reduce.get(), nullptr); }
  // A reduction's output that the compute stream reads later.
  template <class T> TrackedBuffer<T> reduce_output(MemoryCategory category, std::int64_t elements) {
    be.allocate_on(reduce.get());
    auto out = alloc.allocate<T>(category, elements);
    be.allocate_on(nullptr);
    be.record_use(out.data(), nullptr);
    if (replica)
      be.record_use(out.data(), replica.get());
    return out;
  }
  // The replica group's all-reduce of what the shard group's reduction produced.
  template <class T> void replica_all_reduce(T* data, std::size_t count) {
    if (!replica)
      return;
    be.wait(replica.get(), reduce.get());
    replica->all_reduce(data, data, count, data_type_v<T>);
  }

  // The reduced S chunks of earlier units into their fp32 chunks. Queued on the compute stream
  // one unit late, so that a unit's reduce-scatter overlaps the next unit's backward.
  void widen_reduced() {
    if (widen_pending.empty())
      return;
    be.wait(nullptr, reduce.get());
    if (replica)
      be.wait(nullptr, replica.get());
    for (auto& w : widen_pending) {
      auto& un = unit(w.unit);
      timed(Part::copy, [&] { be.widen_add(un.grad_shard.data(), w.chunk.data(), w.chunk.size()); });
    }
    widen_pending.clear();
  }

  // Reduces unit u's gradient held in `input` (padded elements when the optimizer is sharded,
  // whole otherwise). `input` may be the unit's own gradient buffer or a bucket region.
  template <class T> void reduce_from(std::int64_t u, T* input) {
    const auto& us = shape(u);
    auto& un = unit(u);
    const auto c = static_cast<std::size_t>(us.chunk);
    constexpr auto type = data_type_v<T>;
    if (o.spec.shard_optimizer && o.spec.shard_gradients) {
      if constexpr (std::is_same_v<T, S>) {
        if ((kMixed && !policy.low_kept_chunk) || offload.optimizer) {
          // S reduce-scatter, added into the fp32 chunk (FSDP's sharded gradient; DeepSpeed
          // stage 3's fp32 partition).
          if (un.grad_shard.empty())
            un.grad_shard = grads_alloc().template allocate<A>(MemoryCategory::gradients, us.chunk);
          auto out = reduce_output<S>(MemoryCategory::gradients, us.chunk);
          ready_for_reduce();
          reduce->reduce_scatter(input, out.data(), c, type);
          replica_all_reduce(out.data(), c);
          widen_pending.push_back({u, std::move(out)});
          if (offload.optimizer)
            widen_reduced(); // device → host now: the device keeps no chunk (the cost model's)
          return;
        }
        auto& kept = [&]() -> TrackedBuffer<S>& {
          if constexpr (kMixed)
            return un.low_grad_shard;
          else
            return un.grad_shard;
        }();
        if (kept.empty())
          kept = reduce_output<S>(MemoryCategory::gradients, us.chunk);
        else
          accumulate_into_input(u, input, kept.data());
        ready_for_reduce();
        reduce->reduce_scatter(input, kept.data(), c, type);
        replica_all_reduce(kept.data(), c);
      } else {
        throw std::logic_error("sharded gradients are computed in the compute type");
      }
    } else if (o.spec.shard_optimizer) {
      // Whole gradients, sharded optimizer (ZeRO-1): this rank's chunk of the whole buffer gets
      // the reduced chunk. The output must not overlap the input: a bucket region, or a transient.
      T* whole = whole_grads<T>(u);
      T* mine = whole + sl.chunk_begin(u);
      ready_for_reduce();
      if (input != whole) {
        reduce->reduce_scatter(input, mine, c, type);
        replica_all_reduce(mine, c);
      } else {
        auto out = reduce_output<T>(MemoryCategory::buffers, us.chunk);
        reduce->reduce_scatter(input, out.data(), c, type);
        replica_all_reduce(out.data(), c);
        be.wait(nullptr, replica ? replica.get() : reduce.get());
        timed(Part::copy, [&] { copy_elements(mine, out.data(), us.chunk); });
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
        reduce->all_reduce(input + begin, input + begin, n, type);
        replica_all_reduce(input + begin, n);
      }
    }
  }

  // The kept whole gradient of unit u as T: fp32 (PyTorch's, and every fp32 run's) or S
  // (DeepSpeed ZeRO-1's).
  template <class T> T* whole_grads(std::int64_t u) {
    if constexpr (!kMixed)
      return unit(u).grads.data();
    else if constexpr (std::is_same_v<T, S>)
      return low_whole() ? unit(u).low_grads.data() : throw std::logic_error("fp32 whole gradients");
    else
      return low_whole() ? throw std::logic_error("16-bit whole gradients") : unit(u).grads.data();
  }
  // The compute stream's copy of n elements of either type.
  template <class T> void copy_elements(T* dst, const T* src, std::int64_t n) {
    if constexpr (std::is_same_v<T, S>)
      be.copy(dst, src, n);
    else
      be.copy_wide(dst, src, n);
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
      reduce_from<S>(p.unit, buckets[i].data() + p.offset);
    bucket_in_flight[i] = true;
    if (!o.spec.shard_optimizer) { // all-reduced in the bucket: copy the sums back
      wait_for_bucket(i);
      for (const auto& p : pending)
        timed(Part::copy, [&] {
          be.copy(whole_grads<S>(p.unit), buckets[i].data() + p.offset, shape(p.unit).size);
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
    widen_reduced();
    if (!o.spec.shard_gradients && !low_whole() && kMixed) {
      // fp32 whole gradients (DDP): all-reduced in fp32.
      reduce_whole_fp32(u);
      return;
    }
    S* source = o.spec.shard_gradients ? un.fresh.data() : whole_grads<S>(u);
    const std::int64_t len = o.spec.shard_gradients ? us.padded : sl.whole_elements(u, o.spec);
    if (o.spec.contiguous_grad_bucket) {
      // DeepSpeed's contiguous gradients: the unit's gradient is copied into the bucket and its
      // own buffer freed; the bucket is reduced when it holds reduce_bucket_bytes (counted in the
      // reduce dtype, as the cost model counts) or at the first unit. A unit larger than the
      // whole bucket is reduced from its own buffer.
      const std::int64_t capacity = buckets[0].size();
      if (len > capacity) {
        flush_bucket();
        reduce_from<S>(u, source);
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
      // there, and the reduced values copied back into the gradients. The copies back come after
      // the backward (copy_back_buckets), once the compute stream has waited for every reduction,
      // so that it does not wait for each bucket's reduction in turn.
      if constexpr (!kMixed) { // fp32 (mixed precision: reduce_whole_fp32)
        A* region = ddp_bucket.data() + ddp_offset[static_cast<std::size_t>(u)];
        timed(Part::copy, [&] { be.copy(region, source, us.size); });
        reduce_from<S>(u, region);
      }
    } else {
      reduce_from<S>(u, source);
    }
    release_fresh(un);
  }
  // DDP under mixed precision: the fp32 gradient, all-reduced in fp32 from the bucket copy or in
  // place.
  void reduce_whole_fp32(std::int64_t u) {
    if (o.spec.grad_bucket_copy) {
      A* region = ddp_bucket.data() + ddp_offset[static_cast<std::size_t>(u)];
      timed(Part::copy, [&] { be.copy_wide(region, unit(u).grads.data(), shape(u).size); });
      reduce_from<A>(u, region);
      return;
    }
    reduce_from<A>(u, unit(u).grads.data());
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
    std::vector<BlockActivations<S>> saved(static_cast<std::size_t>(L));
    TrackedBuffer<S> x;
    std::optional<HeadForward<S>> head;
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
      // Gathered units the backward gathers again; DDP's copy of the embedding.
      if ((needs_gather(u) && !kept(u)) || (needs_copy(u) && u == 0))
        release(u);
    }
    const double loss = head->loss;

    // ---- backward, of the loss × loss_scale (fp16) / (micro-batches · ranks)
    const double scale = loss_scale / (static_cast<double>(o.grad_accumulation) * sl.world);
    TrackedBuffer<S> dx;
    for (std::int64_t u = U - 1; u >= 0; --u) {
      phase("backward", u, mb);
      acquire(u, true);
      wait_for_gathers(u);
      prefetch_backward(u);
      ensure_grad_target(u);
      if (is_head(u) && tied())
        ensure_grad_target(0); // the head adds into the embedding's
      timed_compute(Part::backward, [&] {
        if (is_head(u)) {
          dx = model.backward_head(params_for(u), embedding_for_head(), std::move(head->saved),
                                   tokens.targets.span(), grad_span(u),
                                   tied() ? grad_span(0) : std::span<S>{}, scale);
        } else if (u > 0) {
          dx =
              model.backward_block(params_for(u), std::move(saved[static_cast<std::size_t>(u - 1)]),
                                   std::move(dx), grad_span(u));
        } else {
          model.backward_embedding(tokens.inputs.span(), std::move(dx), grad_span(0), b);
        }
      });
      if (needs_gather(u) || needs_copy(u))
        release(u);
      widen_whole(u);
      if (reduce_now)
        reduce_unit(u);
    }
    widen_reduced();
    return loss;
  }

  // The reductions are done before the compute reads what they wrote.
  void wait_for_reductions() {
    be.wait(nullptr, reduce.get());
    if (replica)
      be.wait(nullptr, replica.get());
  }

  // grad_bucket_copy without a sharded optimizer: the all-reduced sums back into the gradients
  // (a reduce-scatter wrote its chunk in place otherwise). After wait_for_reductions: the
  // all-reduces write the bucket in place on their own stream.
  void copy_back_buckets() {
    if (!o.spec.grad_bucket_copy || o.spec.shard_optimizer)
      return;
    for (std::int64_t u = 0; u < unit_count(); ++u)
      timed(Part::copy, [&] {
        copy_elements<A>(unit(u).grads.data(),
                         ddp_bucket.data() + ddp_offset[static_cast<std::size_t>(u)],
                         shape(u).size);
      });
  }

  // The fp32 gradient the optimizer reads for unit u (n elements from `begin` of the unit). Under
  // DeepSpeed it is a transient fp32 copy of the gradient partition (the cost model's step_grad):
  // stages 1 and 2 cast their S partition, stage 3 flattens its fp32 partition into a new tensor
  // (stage3.py, _prepare_fp32_grad_for_sub_group).
  struct StepGrad {
    A* data = nullptr;
    TrackedBuffer<A> copy;
  };
  StepGrad step_grad(std::int64_t u, std::int64_t begin, std::int64_t n) {
    if (offload.optimizer)
      return offloaded_step_grad(u, begin, n);
    auto& un = unit(u);
    StepGrad out;
    const S* low = nullptr;
    if constexpr (kMixed) {
      if (o.spec.shard_gradients && policy.low_kept_chunk)
        low = un.low_grad_shard.data();
      else if (!o.spec.shard_gradients && low_whole())
        low = un.low_grads.data() + begin;
    }
    A* kept = low != nullptr                ? nullptr
              : o.spec.shard_gradients ? un.grad_shard.data()
                                       : un.grads.data() + begin;
    if (!policy.low_params) {
      out.data = kept;
      return out;
    }
    if (low != nullptr) { // zeroed, then the widened S partition added
      out.copy = alloc.allocate<A>(MemoryCategory::gradients, n);
      be.widen_add(out.copy.data(), low, n);
    } else {
      out.copy = alloc.allocate_uninitialized<A>(MemoryCategory::gradients, n);
      be.copy_wide(out.copy.data(), kept, n);
    }
    out.data = out.copy.data();
    return out;
  }

  // Whether every rank's gradients are finite (fp16's loss scaling), a world all-reduce.
  bool finite_everywhere(const std::vector<StepGrad>& grads, const std::vector<std::int64_t>& n) {
    double bad = 0;
    for (std::size_t u = 0; u < grads.size(); ++u)
      if (!be.all_finite(grads[u].data, n[u]))
        bad = 1;
    if (g.stand_in)
      return bad == 0;
    auto buffer = g.world->allocate(sizeof(double));
    buffer->copy_from_host(&bad, sizeof(double));
    g.world->all_reduce(buffer->data(), buffer->data(), 1, comm::DataType::f64);
    g.world->synchronize();
    buffer->copy_to_host(&bad, sizeof(double));
    return bad == 0;
  }

  // AdamW on the master weights; DeepSpeed then rounds them into its S partition. Returns
  // whether the update ran (fp16: not when a gradient overflowed).
  bool optimizer_step() {
    phase("optimizer");
    const auto& spec = o.spec;
    const std::int64_t U = unit_count();
    std::vector<StepGrad> grads;
    std::vector<std::int64_t> count;
    for (std::int64_t u = 0; u < U; ++u) {
      const auto& us = shape(u);
      const std::int64_t n = spec.shard_optimizer ? us.chunk : us.size;
      const std::int64_t begin = spec.shard_optimizer ? sl.chunk_begin(u) : 0;
      grads.push_back(step_grad(u, begin, n));
      count.push_back(n);
    }
    if (policy.loss_scaling) {
      if (!finite_everywhere(grads, count)) {
        loss_scale *= 0.5;
        good_steps = 0;
        return false;
      }
      for (std::int64_t u = 0; u < U; ++u) {
        auto& gr = grads[static_cast<std::size_t>(u)];
        // Unscaled in place: the kept fp32 gradient is freed after the step anyway.
        be.scale(gr.data, count[static_cast<std::size_t>(u)], 1.0 / loss_scale);
      }
      if (++good_steps == kLossScaleGrowthInterval) {
        loss_scale *= 2;
        good_steps = 0;
      }
    }
    for (std::int64_t u = 0; u < U; ++u) {
      auto& un = unit(u);
      const auto& us = shape(u);
      const std::int64_t n = count[static_cast<std::size_t>(u)];
      const std::int64_t begin = spec.shard_optimizer ? sl.chunk_begin(u) : 0;
      // The master: DeepSpeed's is a chunk (its optimizer is sharded); fp32 parameters at rest
      // are a chunk when partitioned, else whole.
      A* p = policy.low_params || us.params_sharded ? un.params.data() : un.params.data() + begin;
      if (!un.host_master.empty())
        p = un.host_master.data();
      if (un.exp_avg.size() != n)
        throw std::logic_error(fmt::format("unit {}: {} optimizer elements for {} parameters", u,
                                           un.exp_avg.size(), n));
      be.adamw_step(p, grads[static_cast<std::size_t>(u)].data, un.exp_avg.data(),
                    un.exp_avg_sq.data(), n, step_count, o.adamw);
      if constexpr (kMixed)
        if (policy.low_params)
          be.narrow(us.params_sharded ? un.low.data() : un.low.data() + begin, p, n);
      if (!un.host_master.empty())
        upload_parameters(u, begin, n);
    }
    return true;
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
      const auto c = static_cast<std::size_t>(us.chunk);
      if constexpr (kMixed) {
        if (policy.low_params) {
          S* p = unit(u).low.data();
          shard->all_gather(p + sl.chunk_begin(u), p, c, kS);
          continue;
        }
      }
      A* p = unit(u).params.data();
      shard->all_gather(p + sl.chunk_begin(u), p, c, kA);
    }
  }

  // Parameters drawn on the host (param_init.hpp) as fp32, written into `out` as T.
  template <class T>
  void write_initial(TrackedBuffer<T>& out, std::int64_t u, std::int64_t first) {
    const auto& layout = model.layout();
    const std::int64_t n = out.size();
    std::vector<A> values(static_cast<std::size_t>(n));
    init_unit_params<A>(layout, u, o.seed, first, values);
    std::vector<T> typed(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      typed[i] = narrow<T>(values[i]);
    if (alloc.host_accessible())
      std::copy(typed.begin(), typed.end(), out.data());
    else
      alloc.source().write(out.data(), typed.data(), n * static_cast<std::int64_t>(sizeof(T)));
  }

  void init() {
    const auto& spec = o.spec;
    if (g.world == nullptr)
      throw std::invalid_argument("the world group is missing");
    if (spec.shard_parameters && !spec.shard_gradients)
      throw std::invalid_argument(
          "shard_parameters needs shard_gradients (no framework does otherwise)");
    if (spec.shard_gradients && !spec.shard_optimizer)
      throw std::invalid_argument(
          "shard_gradients needs shard_optimizer (no framework does otherwise)");
    if (o.grad_accumulation < 1)
      throw std::invalid_argument(fmt::format("{} micro-batches per step", o.grad_accumulation));
    if (o.micro_batch.batch < 1 || o.micro_batch.seq < 1)
      throw std::invalid_argument("the micro-batch is empty");
    set_policy();
    offload = offload_policy(spec);
    if (offload.optimizer && !alloc.host_accessible())
      throw std::invalid_argument("offload runs on the CPU backend (its host pool is the heap)");
    const auto& layout = model.layout();
    sl = make_shard_layout(layout, spec, g.world->size(), g.world->rank());
    check_group(g.shard, sl.group, sl.shard_rank, "shard");
    if (sl.replicas > 1)
      check_group(g.replica, sl.replicas, sl.replica_rank, "replica");
    shard = std::make_unique<TimedCommunicator>(*g.shard, stats);
    if (g.shard_reduce != nullptr) {
      check_group(g.shard_reduce, sl.group, sl.shard_rank, "shard reduce");
      reduce = std::make_unique<TimedCommunicator>(*g.shard_reduce, stats);
    } else {
      reduce = std::make_unique<TimedCommunicator>(*g.shard, stats);
    }
    if (sl.replicas > 1)
      replica = std::make_unique<TimedCommunicator>(*g.replica, stats);

    if (o.prefetch_as_planned && spec.shard_parameters) {
      fwd_prefetch = spec.forward_prefetch;
      bwd_prefetch = spec.backward_prefetch;
      // DeepSpeed: as many blocks ahead as stage3_prefetch_bucket_size elements hold (at least
      // one), as the cost model derives it.
      const double block = static_cast<double>(layout.block().size);
      if (spec.prefetch_bucket_elems > 0 && block > 0)
        fwd_prefetch = std::max(1, static_cast<int>(spec.prefetch_bucket_elems / block));
    }

    // ---- state present before the first step: parameters, optimizer states, persistent buffers.
    const std::int64_t U = layout.unit_count();
    units.resize(static_cast<std::size_t>(U));
    for (std::int64_t u = 0; u < U; ++u) {
      auto& un = unit(u);
      const auto& us = shape(u);
      const std::int64_t n = us.params_sharded ? us.chunk : sl.whole_elements(u, spec);
      const std::int64_t first = us.params_sharded ? sl.chunk_begin(u) : 0;
      TrackedAllocator& at_rest = offload.params && us.params_sharded ? host_pool : alloc;
      if (policy.low_params) {
        un.low = at_rest.allocate<S>(MemoryCategory::parameters, n);
        write_initial(un.low, u, first);
      } else {
        un.params = at_rest.allocate<A>(MemoryCategory::parameters, n);
        write_initial(un.params, u, first);
      }
    }
    for (std::int64_t u = 0; u < U; ++u) {
      auto& un = unit(u);
      const auto& us = shape(u);
      const std::int64_t n = spec.shard_optimizer ? us.chunk : us.size;
      TrackedAllocator& states = offload.optimizer ? host_pool : alloc;
      if (policy.low_params) { // DeepSpeed's fp32 master partition
        un.params = states.allocate<A>(MemoryCategory::optimizer_states, n);
        write_initial(un.params, u, spec.shard_optimizer ? sl.chunk_begin(u) : 0);
      } else if (offload.optimizer && !(offload.params && us.params_sharded)) {
        un.host_master = host_pool.allocate<A>(MemoryCategory::optimizer_states, n);
        write_initial(un.host_master, u, sl.chunk_begin(u));
      }
      un.exp_avg = states.allocate<A>(MemoryCategory::optimizer_states, n);
      un.exp_avg_sq = states.allocate<A>(MemoryCategory::optimizer_states, n);
    }
    if (spec.grad_bucket_copy) {
      std::int64_t total = 0;
      for (std::int64_t u = 0; u < U; ++u) {
        ddp_offset.push_back(total);
        total += sl.whole_elements(u, spec);
      }
      ddp_bucket = alloc.allocate<A>(MemoryCategory::buffers, total);
    }
    if (spec.contiguous_grad_bucket) {
      const auto elements = static_cast<std::int64_t>(spec.reduce_bucket_bytes / sizeof(S));
      buckets[0] = alloc.allocate<S>(MemoryCategory::buffers, elements);
      if (spec.flat_grad_partition)
        buckets[1] = alloc.allocate<S>(MemoryCategory::buffers, elements);
    }
  }

  void set_policy() {
    const auto want = costmodel::compute_dtype(o.precision);
    const bool mixed = o.precision != costmodel::Precision::fp32;
    if (mixed != kMixed || (std::is_same_v<S, bf16> && want != costmodel::DType::bf16) ||
        (std::is_same_v<S, f16> && want != costmodel::DType::fp16))
      throw std::logic_error("the engine's compute type is not the precision's");
    policy = precision_policy(o.precision, o.spec);
    if (policy.loss_scaling) {
      if (!(o.initial_loss_scale > 0) || !std::isfinite(o.initial_loss_scale))
        throw std::invalid_argument(
            fmt::format("initial loss scale {}: must be positive", o.initial_loss_scale));
      loss_scale = o.initial_loss_scale;
    }
  }

  // ---- host offload (host_offload.hpp)

  // Where reduced gradient chunks are kept: the host pool under optimizer offload.
  TrackedAllocator& grads_alloc() { return offload.optimizer ? host_pool : alloc; }

  // Parameter offload: the unit's chunk goes host → device into its own slot of the gathered
  // buffer (cast to S on the way when the host keeps fp32), and the all-gather runs in place.
  void gather_offloaded(std::int64_t u, TrackedBuffer<S>& out) {
    const auto& us = shape(u);
    auto& un = unit(u);
    out = alloc.allocate_uninitialized<S>(MemoryCategory::buffers, us.padded);
    S* slot = out.data() + static_cast<std::int64_t>(sl.shard_rank) * us.chunk;
    timed(Part::copy, [&] {
      if (policy.low_params)
        be.copy(slot, un.low.data(), us.chunk);
      else
        be.narrow(slot, un.params.data(), us.chunk);
    });
    be.wait(shard.get(), nullptr);
    shard->all_gather(slot, out.data(), static_cast<std::size_t>(us.chunk), kS);
    be.record_use(out.data(), shard.get());
  }

  // The fp32 gradient AdamW reads on the host: the kept host chunk (sharded gradients), or this
  // rank's part of the device's whole gradient copied device → host (ZeRO-1), timed with the
  // optimizer.
  StepGrad offloaded_step_grad(std::int64_t u, std::int64_t begin, std::int64_t n) {
    auto& un = unit(u);
    StepGrad out;
    if (o.spec.shard_gradients) {
      out.data = un.grad_shard.data();
      return out;
    }
    out.copy = host_pool.allocate<A>(MemoryCategory::gradients, n);
    if (low_whole())
      be.widen_add(out.copy.data(), un.low_grads.data() + begin, n);
    else
      be.copy_wide(out.copy.data(), un.grads.data() + begin, n);
    out.data = out.copy.data();
    return out;
  }

  // After AdamW on the host master: the updated part host → device (the device's fp32
  // parameters; DeepSpeed's S partition is rounded from the master by optimizer_step). Timed
  // with the optimizer, as the cost model's "CPU optimizer + upload".
  void upload_parameters(std::int64_t u, std::int64_t begin, std::int64_t n) {
    auto& un = unit(u);
    A* device = shape(u).params_sharded ? un.params.data() : un.params.data() + begin;
    be.copy_wide(device, un.host_master.data(), n);
  }

  // ---- the public interface

  StepReport step() override {
    stats = {};
    compute_cpu_s = 0;
    (void)be.take_seconds();
    ++step_count;
    StepReport r;
    r.step = step_count;
    r.loss_scale = loss_scale;
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    double loss_sum = 0;
    const std::int64_t gas = o.grad_accumulation;
    for (std::int64_t mb = 0; mb < gas; ++mb)
      loss_sum += micro_batch(mb, o.spec.shard_gradients || mb == gas - 1);
    wait_for_reductions();
    copy_back_buckets();
    bool updated = true;
    timed(Part::optimizer, [&] { updated = optimizer_step(); });
    r.skipped = !updated;
    if (updated)
      gather_updated_parameters();
    // Everything queued is done (a GPU's streams; nothing to wait for on the host).
    phase("end of the step");
    for (auto* c : {shard.get(), reduce.get(), replica.get()})
      if (c != nullptr)
        c->synchronize();
    be.synchronize();
    // zero_grad(set_to_none=True): the gradients kept through the step are released.
    for (auto& un : units) {
      un.grads.reset();
      un.low_grads.reset();
      un.grad_shard.reset();
      un.low_grad_shard.reset();
    }
    r.step_s = seconds_since(t0);
    r.step_cpu_s = thread_cpu_seconds() - c0;
    r.compute_cpu_s = compute_cpu_s;
    const auto parts = be.take_seconds();
    r.forward_s = parts.forward;
    r.backward_s = parts.backward;
    r.compute_s = parts.forward + parts.backward;
    r.optimizer_s = parts.optimizer;
    r.copy_s = parts.copy;
    auto waited = [&](const comm::Communicator* c) {
      const auto it = parts.comm_waits.find(c);
      return c != nullptr && it != parts.comm_waits.end() ? it->second : 0.0;
    };
    r.gather_wait_s = waited(shard.get());
    r.reduce_wait_s = waited(reduce.get());
    r.replica_wait_s = waited(replica.get());
    r.comm_wait_s = r.gather_wait_s + r.reduce_wait_s + r.replica_wait_s;
    r.collectives = stats;
    // The loss of the global batch (outside the step's time), in memory the world's collectives
    // use.
    double local = loss_sum / static_cast<double>(gas);
    if (g.stand_in) {
      r.loss = local;
    } else {
      phase("loss");
      auto buffer = g.world->allocate(sizeof(double));
      buffer->copy_from_host(&local, sizeof(double));
      g.world->all_reduce(buffer->data(), buffer->data(), 1, comm::DataType::f64);
      g.world->synchronize();
      double sum = 0;
      buffer->copy_to_host(&sum, sizeof(double));
      r.loss = sum / sl.world;
    }
    return r;
  }

  std::vector<float> full_parameters(std::int64_t u) override {
    const auto& us = shape(u);
    auto& un = unit(u);
    std::vector<A> out(static_cast<std::size_t>(us.padded));
    be.synchronize();
    // The fp32 weights: parameters at rest, or DeepSpeed's master (a chunk: its optimizer is
    // sharded).
    const bool chunked = policy.low_params ? o.spec.shard_optimizer : us.params_sharded;
    if (chunked) {
      const auto bytes = static_cast<std::size_t>(us.padded) * sizeof(A);
      auto gathered = g.shard->allocate(bytes);
      g.shard->all_gather(un.params.data(), gathered->data(), static_cast<std::size_t>(us.chunk),
                          kA);
      g.shard->synchronize();
      gathered->copy_to_host(out.data(), bytes);
    } else {
      alloc.source().read(out.data(), un.params.data(),
                          us.size * static_cast<std::int64_t>(sizeof(A)));
    }
    out.resize(static_cast<std::size_t>(us.size));
    return {out.begin(), out.end()};
  }

  const GptLayout& layout() const override { return model.layout(); }
  const ShardLayout& shards() const override { return sl; }
  const EngineOptions& options() const override { return o; }
  std::int64_t steps_done() const override { return step_count; }
  int forward_prefetch() const override { return fwd_prefetch; }
  int backward_prefetch() const override { return bwd_prefetch; }

  ShardingEngine::UnitState unit_state(std::int64_t u) override {
    if constexpr (kMixed) {
      (void)u;
      throw std::logic_error("checkpoints hold fp32 runs only");
    } else {
      auto& un = unit(u);
      const bool chunked_params = shape(u).params_sharded;
      return {un.params.span(), chunked_params ? sl.chunk_begin(u) : 0, un.exp_avg.span(),
              un.exp_avg_sq.span(), o.spec.shard_optimizer ? sl.chunk_begin(u) : 0};
    }
  }
  void set_steps_done(std::int64_t steps) override {
    if (steps < 0)
      throw std::invalid_argument(fmt::format("{} steps done", steps));
    step_count = steps;
  }
};

std::unique_ptr<ShardingEngine::Impl> make_engine(EngineOptions options,
                                                  TrackedAllocator& allocator,
                                                  EngineGroups groups) {
  switch (costmodel::compute_dtype(options.precision)) {
    case costmodel::DType::bf16:
      if (options.precision == costmodel::Precision::bf16_mixed)
        return std::make_unique<State<bf16>>(std::move(options), allocator, groups);
      break;
    case costmodel::DType::fp16:
      return std::make_unique<State<f16>>(std::move(options), allocator, groups);
    default:
      return std::make_unique<State<float>>(std::move(options), allocator, groups);
  }
  throw std::invalid_argument(
      "pure bf16 (bf16 optimizer states) is not run by the executor; use bf16-mixed");
}

} // namespace

PrecisionPolicy precision_policy(costmodel::Precision p, const costmodel::ShardingSpec& spec) {
  using costmodel::Precision;
  PrecisionPolicy policy;
  if (p == Precision::bf16)
    throw std::invalid_argument(
        "pure bf16 (bf16 optimizer states) is not run by the executor; use bf16-mixed");
  if (p == Precision::fp32)
    return policy;
  const auto b = costmodel::state_bytes(p, spec, costmodel::Accounting::framework);
  policy.low_params = b.param < 4;
  policy.autocast_copies = spec.flavour == costmodel::Flavour::ddp && b.compute < b.param;
  policy.low_whole_grads = b.grad < 4;
  policy.low_kept_chunk = b.grad < 4 && !spec.flat_grad_partition;
  policy.loss_scaling = p == Precision::fp16_mixed;
  if (policy.low_params && b.master <= 0)
    throw std::invalid_argument("16-bit parameters at rest need an fp32 master copy");
  // Reductions run in the type the gradients are in: the compute type for sharded gradients and
  // DeepSpeed's, fp32 for PyTorch's whole gradients. The cost model reduces in
  // max(reduce_dtype, compute dtype).
  const double reduce_bytes = std::max(costmodel::dtype_bytes(spec.reduce_dtype), b.compute);
  const double engine_bytes = spec.shard_gradients || policy.low_whole_grads ? b.compute : 4.0;
  if (reduce_bytes != engine_bytes)
    throw std::invalid_argument(fmt::format(
        "reduce_dtype {} with {}: the executor reduces {} gradients in {}",
        costmodel::dtype_name(spec.reduce_dtype), costmodel::precision_name(p),
        spec.shard_gradients ? "sharded" : "whole",
        engine_bytes == 4 ? "fp32" : costmodel::dtype_name(costmodel::compute_dtype(p))));
  if (spec.grad_bucket_copy && policy.low_whole_grads)
    throw std::invalid_argument("a DDP bucket copy of 16-bit gradients is not run");
  if (spec.contiguous_grad_bucket && !(spec.shard_gradients || policy.low_whole_grads))
    throw std::invalid_argument("a contiguous gradient bucket of fp32 gradients is not run");
  return policy;
}

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
    : s_(make_engine(std::move(options), allocator, groups)) {}

ShardingEngine::~ShardingEngine() = default;

StepReport ShardingEngine::step() {
  return s_->step();
}
std::vector<float> ShardingEngine::full_parameters(std::int64_t unit) {
  return s_->full_parameters(unit);
}
const GptLayout& ShardingEngine::layout() const {
  return s_->layout();
}
const ShardLayout& ShardingEngine::shards() const {
  return s_->shards();
}
const EngineOptions& ShardingEngine::options() const {
  return s_->options();
}
std::int64_t ShardingEngine::steps_done() const {
  return s_->steps_done();
}
ShardingEngine::UnitState ShardingEngine::unit_state(std::int64_t unit) {
  return s_->unit_state(unit);
}
void ShardingEngine::set_steps_done(std::int64_t steps) {
  s_->set_steps_done(steps);
}
int ShardingEngine::forward_prefetch() const {
  return s_->forward_prefetch();
}
int ShardingEngine::backward_prefetch() const {
  return s_->backward_prefetch();
}

} // namespace shardplan::executor
