// The step loop (engine.hpp): the order in which the parts act on the engine's state
// (engine_state.hpp) — gathers before each unit's compute (gather_scheduler.hpp), gradient
// targets and reductions after each unit's backward (grad_buffer.hpp), the optimizer step and the
// parameter all-gather (optimizer_step.hpp) — and the step's report.
#include "executor/engine.hpp"
#include "documents/mesh.hpp"

#include <chrono>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "executor/engine_state.hpp"
#include "executor/gather_scheduler.hpp"
#include "executor/grad_buffer.hpp"
#include "executor/optimizer_step.hpp"
#include "executor/synthetic_data.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::bf16;
using kernels::f16;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

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

// The engine for compute type S: the parts, ordered.
template <class S> class StepLoop final : public ShardingEngine::Impl {
public:
  StepLoop(EngineOptions options, TrackedAllocator& allocator, EngineGroups groups)
      : state_(std::move(options), allocator, groups), grads_(state_), gathers_(state_),
        optimizer_(state_) {}

  StepReport step() override;
  std::vector<float> full_parameters(std::int64_t u) override;
  const GptLayout& layout() const override { return state_.model.layout(); }
  const ShardLayout& shards() const override { return state_.shards; }
  const EngineOptions& options() const override { return state_.options; }
  std::int64_t steps_done() const override { return state_.step_count; }
  int forward_prefetch() const override { return gathers_.depth().forward; }
  int backward_prefetch() const override { return gathers_.depth().backward; }
  ShardingEngine::UnitState unit_state(std::int64_t u) override;
  void set_steps_done(std::int64_t steps) override {
    if (steps < 0) throw std::invalid_argument(fmt::format("{} steps done", steps));
    state_.step_count = steps;
  }

private:
  using A = typename EngineState<S>::A;
  using Part = typename EngineState<S>::Part;
  static constexpr bool kMixed = EngineState<S>::kMixed;

  // What the forward leaves for the backward: each block's saved activations, the head's.
  struct ForwardResult {
    std::vector<BlockActivations<S>> saved;  // [blocks]
    std::optional<HeadForward<S>> head;
  };

  double micro_batch(std::int64_t mb, bool reduce_now);
  ForwardResult forward(std::int64_t mb, const TokenBatch& tokens);
  void backward(std::int64_t mb, const TokenBatch& tokens, ForwardResult& fwd, bool reduce_now);
  void finish_step();
  void fill_timings(StepReport& report);
  double global_loss(double local);

  EngineState<S> state_;
  GradBuffers<S> grads_;
  GatherScheduler<S> gathers_;
  OptimizerStep<S> optimizer_;
};

template <class S> double StepLoop<S>::micro_batch(std::int64_t mb, bool reduce_now) {
  auto& st = state_;
  const auto& b = st.options.micro_batch;
  // Under context parallelism the engine's ranks are d data-parallel replicas × c ranks sharing
  // their sequences, rank dp·c + cp (context_parallel.hpp).
  const auto& cp = st.options.model_options.context_parallel;
  const int replicas = st.shards.world / cp.size(), replica = st.world_rank() / cp.size();
  const std::int64_t global_batch = b.batch * st.options.grad_accumulation * replicas;
  const std::int64_t first =
      (st.step_count - 1) * global_batch + (mb * replicas + replica) * b.batch;
  auto tokens = synthetic_sequences(
      st.allocator, st.options.seed, first, b,
      st.options.model_options.tensor_parallel.vocab(st.options.model), {cp.size(), cp.rank()});
  ForwardResult fwd = forward(mb, tokens);
  const double loss = fwd.head->loss;
  backward(mb, tokens, fwd, reduce_now);
  return loss;
}

template <class S>
typename StepLoop<S>::ForwardResult StepLoop<S>::forward(std::int64_t mb,
                                                         const TokenBatch& tokens) {
  auto& st = state_;
  const std::int64_t units = st.unit_count();
  const auto& b = st.options.micro_batch;
  ForwardResult fwd;
  fwd.saved.resize(static_cast<std::size_t>(units - 2));
  TrackedBuffer<S> x;  // the activations between units [batch, seq, hidden]
  for (std::int64_t u = 0; u < units; ++u) {
    st.phase("forward", u, mb);
    gathers_.acquire(u);
    gathers_.wait_for_gathers(u);
    gathers_.prefetch_forward(u);
    st.timed_compute(Part::forward, [&] {
      const auto params = gathers_.params_for(u);
      if (u == 0) {
        x = st.model.forward_embedding(params, tokens.inputs.span(), b);
      } else if (u < units - 1) {
        auto f = st.model.forward_block(params, std::move(x), b, st.options.checkpointing);
        x = std::move(f.output);
        fwd.saved[static_cast<std::size_t>(u - 1)] = std::move(f.saved);
      } else {
        fwd.head.emplace(st.model.forward_head(params, gathers_.embedding_for_head(), std::move(x),
                                               tokens.targets.span(), b));
      }
    });
    // Gathered units the backward gathers again; DDP's copy of the embedding.
    if ((gathers_.needs_gather(u) && !gathers_.kept(u)) || (gathers_.needs_copy(u) && u == 0))
      gathers_.release(u);
  }
  return fwd;
}

// The backward of the loss × loss_scale (fp16) / (micro-batches · ranks).
template <class S>
void StepLoop<S>::backward(std::int64_t mb, const TokenBatch& tokens, ForwardResult& fwd,
                           bool reduce_now) {
  auto& st = state_;
  const auto& b = st.options.micro_batch;
  const double scale = optimizer_.loss_scaler().scale() /
                       (static_cast<double>(st.options.grad_accumulation) * st.shards.world);
  TrackedBuffer<S> dx;  // the gradient of the activations between units
  for (std::int64_t u = st.unit_count() - 1; u >= 0; --u) {
    st.phase("backward", u, mb);
    gathers_.acquire(u, true);
    gathers_.wait_for_gathers(u);
    gathers_.prefetch_backward(u);
    grads_.ensure_target(u);
    if (st.is_head(u) && st.tied()) grads_.ensure_target(0);  // the head adds into the embedding's
    st.timed_compute(Part::backward, [&] {
      if (st.is_head(u)) {
        dx = st.model.backward_head(gathers_.params_for(u), gathers_.embedding_for_head(),
                                    std::move(fwd.head->saved), tokens.targets.span(),
                                    grads_.target(u), st.tied() ? grads_.target(0) : std::span<S>{},
                                    scale);
      } else if (u > 0) {
        dx = st.model.backward_block(gathers_.params_for(u),
                                     std::move(fwd.saved[static_cast<std::size_t>(u - 1)]),
                                     std::move(dx), grads_.target(u));
      } else {
        st.model.backward_embedding(tokens.inputs.span(), std::move(dx), grads_.target(0), b);
      }
    });
    if (gathers_.needs_gather(u) || gathers_.needs_copy(u)) gathers_.release(u);
    grads_.widen_whole(u);
    if (reduce_now) grads_.reduce_unit(u);
  }
  grads_.widen_reduced();
}

// Everything queued is done (a GPU's streams; nothing to wait for on the host), and the
// gradients kept through the step are released.
template <class S> void StepLoop<S>::finish_step() {
  auto& st = state_;
  st.phase("end of the step");
  for (auto* c : {st.streams.gather.get(), st.streams.reduce.get(), st.streams.replica.get()})
    if (c != nullptr) c->synchronize();
  st.backend.synchronize();
  grads_.release_step_gradients();
}

template <class S> void StepLoop<S>::fill_timings(StepReport& r) {
  auto& st = state_;
  r.compute_cpu_s = st.compute_cpu_s;
  const auto parts = st.backend.take_seconds();
  r.forward_s = parts.forward;
  r.backward_s = parts.backward;
  r.compute_s = parts.forward + parts.backward;
  r.optimizer_s = parts.optimizer;
  r.copy_s = parts.copy;
  auto waited = [&](const comm::Communicator* c) {
    const auto it = parts.comm_waits.find(c);
    return c != nullptr && it != parts.comm_waits.end() ? it->second : 0.0;
  };
  r.gather_wait_s = waited(st.streams.gather.get());
  r.reduce_wait_s = waited(st.streams.reduce.get());
  r.replica_wait_s = waited(st.streams.replica.get());
  r.comm_wait_s = r.gather_wait_s + r.reduce_wait_s + r.replica_wait_s;
  r.collectives = st.stats;
}

// The loss of the global batch (outside the step's time), in memory the world's collectives use.
template <class S> double StepLoop<S>::global_loss(double local) {
  auto& st = state_;
  if (st.groups.stand_in) return local;
  st.phase("loss");
  auto* world = st.groups.world;
  auto buffer = world->allocate(sizeof(double));
  buffer->copy_from_host(&local, sizeof(double));
  world->all_reduce(buffer->data(), buffer->data(), 1, comm::DataType::f64);
  world->synchronize();
  double sum = 0;
  buffer->copy_to_host(&sum, sizeof(double));
  return sum / st.shards.world;
}

template <class S> StepReport StepLoop<S>::step() {
  auto& st = state_;
  st.stats = {};
  st.compute_cpu_s = 0;
  (void)st.backend.take_seconds();
  ++st.step_count;
  StepReport r;
  r.step = st.step_count;
  r.loss_scale = optimizer_.loss_scaler().scale();
  const auto t0 = Clock::now();
  const double c0 = thread_cpu_seconds();
  double loss_sum = 0;
  const std::int64_t gas = st.options.grad_accumulation;
  for (std::int64_t mb = 0; mb < gas; ++mb)
    loss_sum += micro_batch(mb, st.spec().shard_gradients || mb == gas - 1);
  grads_.wait_for_reductions();
  grads_.copy_back_buckets();
  bool updated = true;
  st.timed(Part::optimizer, [&] { updated = optimizer_.run(); });
  r.skipped = !updated;
  if (updated) gathers_.gather_updated_parameters();
  finish_step();
  r.step_s = seconds_since(t0);
  r.step_cpu_s = thread_cpu_seconds() - c0;
  fill_timings(r);
  r.loss = global_loss(loss_sum / static_cast<double>(gas));
  return r;
}

template <class S> std::vector<float> StepLoop<S>::full_parameters(std::int64_t u) {
  auto& st = state_;
  const auto& us = st.shape(u);
  auto& buffers = st.unit(u);
  std::vector<A> out(static_cast<std::size_t>(us.padded));
  st.backend.synchronize();
  // The fp32 weights: parameters at rest, or DeepSpeed's master (a chunk: its optimizer is
  // sharded).
  const bool chunked = st.policy.low_params ? st.spec().shard_optimizer : us.params_sharded;
  if (chunked) {
    const auto bytes = static_cast<std::size_t>(us.padded) * sizeof(A);
    auto* shard = st.groups.shard;
    auto gathered = shard->allocate(bytes);
    shard->all_gather(buffers.params.data(), gathered->data(), static_cast<std::size_t>(us.chunk),
                      EngineState<S>::kA);
    shard->synchronize();
    gathered->copy_to_host(out.data(), bytes);
  } else {
    st.allocator.source().read(out.data(), buffers.params.data(),
                               us.size * static_cast<std::int64_t>(sizeof(A)));
  }
  out.resize(static_cast<std::size_t>(us.size));
  return {out.begin(), out.end()};
}

template <class S> ShardingEngine::UnitState StepLoop<S>::unit_state(std::int64_t u) {
  if constexpr (kMixed) {
    (void)u;
    throw std::logic_error("checkpoints hold fp32 runs only");
  } else {
    auto& st = state_;
    auto& buffers = st.unit(u);
    const bool chunked_params = st.shape(u).params_sharded;
    return {buffers.params.span(), chunked_params ? st.shards.chunk_begin(u) : 0,
            buffers.exp_avg.span(), buffers.exp_avg_sq.span(),
            st.spec().shard_optimizer ? st.shards.chunk_begin(u) : 0};
  }
}

std::unique_ptr<ShardingEngine::Impl>
make_engine(EngineOptions options, TrackedAllocator& allocator, EngineGroups groups) {
  switch (documents::compute_dtype(options.precision)) {
  case documents::DType::bf16:
    if (options.precision == documents::Precision::bf16_mixed)
      return std::make_unique<StepLoop<bf16>>(std::move(options), allocator, groups);
    break;
  case documents::DType::fp16:
    return std::make_unique<StepLoop<f16>>(std::move(options), allocator, groups);
  default:
    return std::make_unique<StepLoop<float>>(std::move(options), allocator, groups);
  }
  throw std::invalid_argument(
      "pure bf16 (bf16 optimizer states) is not run by the executor; use bf16-mixed");
}

}  // namespace

PrecisionPolicy precision_policy(documents::Precision p, const documents::ShardingSpec& spec) {
  using documents::Precision;
  PrecisionPolicy policy;
  if (p == Precision::bf16)
    throw std::invalid_argument(
        "pure bf16 (bf16 optimizer states) is not run by the executor; use bf16-mixed");
  if (p == Precision::fp32) return policy;
  const auto b = documents::state_bytes(p, spec);
  policy.low_params = b.param < 4;
  policy.autocast_copies = spec.flavour == documents::Flavour::ddp && b.compute < b.param;
  policy.low_whole_grads = b.grad < 4;
  policy.low_kept_chunk = b.grad < 4 && !spec.flat_grad_partition;
  policy.loss_scaling = p == Precision::fp16_mixed;
  if (policy.low_params && b.master <= 0)
    throw std::invalid_argument("16-bit parameters at rest need an fp32 master copy");
  // Reductions run in the type the gradients are in: the compute type for sharded gradients and
  // DeepSpeed's, fp32 for PyTorch's whole gradients. The cost model reduces in
  // max(reduce_dtype, compute dtype).
  const double reduce_bytes = std::max(documents::dtype_bytes(spec.reduce_dtype), b.compute);
  const double engine_bytes = spec.shard_gradients || policy.low_whole_grads ? b.compute : 4.0;
  if (reduce_bytes != engine_bytes)
    throw std::invalid_argument(fmt::format(
        "reduce_dtype {} with {}: the executor reduces {} gradients in {}",
        documents::dtype_name(spec.reduce_dtype), documents::precision_name(p),
        spec.shard_gradients ? "sharded" : "whole",
        engine_bytes == 4 ? "fp32" : documents::dtype_name(documents::compute_dtype(p))));
  if (spec.grad_bucket_copy && policy.low_whole_grads)
    throw std::invalid_argument("a DDP bucket copy of 16-bit gradients is not run");
  if (spec.contiguous_grad_bucket && !(spec.shard_gradients || policy.low_whole_grads))
    throw std::invalid_argument("a contiguous gradient bucket of fp32 gradients is not run");
  return policy;
}

OwnedGroups make_groups(comm::Communicator& world, const documents::ShardingSpec& spec,
                        bool separate_reduce_stream) {
  OwnedGroups g;
  const int n = world.size(), r = world.rank(), S = spec.group(n);
  if (S < 1 || S > n || n % S != 0)
    throw std::invalid_argument(
        fmt::format("a shard group of {} ranks does not divide {} ranks", S, n));
  if (S < n) {  // HSDP: shards of S consecutive ranks, replicated over n / S (documents/mesh.hpp)
    using documents::Dim;
    const documents::Mesh m(1, n / S, S, 1, 1);
    const auto shard = m.split(r, {Dim::shard});
    const auto replica = m.split(r, {Dim::replicate});
    g.shard = world.split(shard.color, shard.key);
    g.replica = world.split(replica.color, replica.key);
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
    : impl_(make_engine(std::move(options), allocator, groups)) {}

ShardingEngine::~ShardingEngine() = default;

StepReport ShardingEngine::step() { return impl_->step(); }
std::vector<float> ShardingEngine::full_parameters(std::int64_t unit) {
  return impl_->full_parameters(unit);
}
const GptLayout& ShardingEngine::layout() const { return impl_->layout(); }
const ShardLayout& ShardingEngine::shards() const { return impl_->shards(); }
const EngineOptions& ShardingEngine::options() const { return impl_->options(); }
std::int64_t ShardingEngine::steps_done() const { return impl_->steps_done(); }
ShardingEngine::UnitState ShardingEngine::unit_state(std::int64_t unit) {
  return impl_->unit_state(unit);
}
void ShardingEngine::set_steps_done(std::int64_t steps) { impl_->set_steps_done(steps); }
int ShardingEngine::forward_prefetch() const { return impl_->forward_prefetch(); }
int ShardingEngine::backward_prefetch() const { return impl_->backward_prefetch(); }

}  // namespace shardplan::executor
