#include "executor/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/pipeline_order.hpp"
#include "executor/param_init.hpp"
#include "executor/synthetic_data.hpp"

namespace shardplan::executor {

using core::InputError;
using documents::PipeOp;
using documents::PipeOpKind;

StageUnits stage_units(std::int64_t layers, int stages, int stage) {
  const std::int64_t per_stage = layers / stages;
  StageUnits u;
  u.first = stage == 0 ? 0 : 1 + stage * per_stage;
  u.last = stage == stages - 1 ? layers + 2 : 1 + (stage + 1) * per_stage;
  return u;
}

void check_pipeline(const PipelineOptions& o, int world) {
  const int p = o.stages;
  if (p < 1) throw InputError("--pipeline-parallel", fmt::format("must be >= 1, got {}", p));
  if (world % p != 0)
    throw InputError("--pipeline-parallel",
                     fmt::format("{} does not divide the {} ranks of the job", p, world));
  if (o.model.layers % p != 0)
    throw InputError("--pipeline-parallel",
                     fmt::format("{} does not divide the model's {} layers", p, o.model.layers));
  if (o.micro_batches < 1)
    throw InputError("--micro-batches", fmt::format("must be >= 1, got {}", o.micro_batches));
  if (o.schedule == documents::PipelineSchedule::interleaved_1f1b)
    throw InputError("--schedule", "interleaved-1f1b is not run by the executor (one model chunk "
                                   "per stage): give 1f1b or gpipe");
}

StagePeak stage_peak(const PipelineOptions& o, int stage) {
  const GptLayout layout(o.model);
  const int p = o.stages;
  const StageUnits u = stage_units(o.model.layers, p, stage);
  const bool first = stage == 0, last = stage == p - 1;
  const bool tied = layout.head().output == kAbsent;
  const std::int64_t f = sizeof(float), N = o.micro_batch.tokens(), h = o.model.hidden;
  const std::int64_t I = o.model.intermediate;
  const std::int64_t blocks = o.model.layers / p;
  StagePeak peak;
  std::int64_t elements = 0;
  for (std::int64_t unit = u.first; unit < u.last; ++unit) elements += layout.unit_size_of(unit);
  if (tied && last && !first) elements += layout.unit_size_of(0);
  peak.states = 4 * f * elements;
  peak.saved = blocks * block_saved_bytes(layout, o.micro_batch, o.checkpointing,
                                          o.model_options.flash_attention, f);
  if (first || last) peak.saved += 2 * N * static_cast<std::int64_t>(sizeof(std::int32_t));
  if (last) peak.saved += head_saved_bytes(layout, o.micro_batch, f);
  const bool swiglu = o.model.mlp == documents::MlpKind::swiglu;
  if (blocks > 0) peak.transient = (2 * N * h + (swiglu ? 2 : 1) * N * I) * f;
  if (last)
    peak.transient = std::max(peak.transient, head_backward_bytes(layout, o.micro_batch, f));
  if (!last) peak.transient = std::max(peak.transient, 2 * N * h * f);
  const auto chunks =
      documents::peak_chunks(documents::schedule_ops(o.schedule, p, 1, o.micro_batches));
  peak.in_flight = chunks.at(static_cast<std::size_t>(stage));
  return peak;
}

PipelineGroups make_pipeline_groups(comm::Communicator& world, int stages) {
  const int d = world.size() / stages, rank = world.rank();
  const int stage = rank / d, index = rank % d;
  PipelineGroups g;
  g.pipeline = world.split(index, stage);
  g.data = world.split(stage, index);
  const bool end = stage == 0 || stage == stages - 1;
  g.tied = world.split(end ? index : d + rank, stage);
  return g;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct UnitState {
  std::int64_t unit = 0;
  TrackedBuffer<float> params, grads, exp_avg, exp_avg_sq;  // [unit size] each
};

// What one micro-batch keeps from its forward to its backward on this stage.
struct InFlight {
  std::optional<TokenBatch> tokens;  // first and last stage: inputs, targets
  std::vector<BlockActivations<float>> saved;
  std::optional<HeadActivations<float>> head;
};

}  // namespace

struct PipelineTrainer::Impl {
  PipelineOptions options;
  TrackedAllocator& allocator;
  comm::Communicator& pipeline;
  comm::Communicator& data;
  comm::Communicator& tied;
  GptModel<float> model;
  StageUnits units;
  bool tied_head = false;
  std::vector<UnitState> states;  // this stage's units; the embedding too on a tied last stage
  std::int64_t steps_done = 0;
  std::vector<std::optional<InFlight>> in_flight;  // [m]
  TrackedBuffer<float> received;  // an input received ahead by an exchange, for the next step
  double loss_sum = 0;
  PipelineReport report;

  Impl(PipelineOptions o, TrackedAllocator& a, PipelineGroups& g)
      : options(std::move(o)), allocator(a), pipeline(*g.pipeline), data(*g.data), tied(*g.tied),
        model(options.model, allocator, options.model_options) {}

  int stage() const { return pipeline.rank(); }
  int stages() const { return pipeline.size(); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  std::int64_t head_unit() const { return options.model.layers + 1; }
  std::int64_t hidden_elements() const {
    return options.micro_batch.tokens() * options.model.hidden;
  }

  UnitState& state(std::int64_t unit) {
    for (auto& s : states)
      if (s.unit == unit) return s;
    throw std::out_of_range(fmt::format("unit {} is not on pipeline stage {}", unit, stage()));
  }
  std::span<const float> params(std::int64_t unit) { return state(unit).params.span(); }

  void allocate_states();
  TrackedBuffer<float> forward(int k, TrackedBuffer<float> input);
  TrackedBuffer<float> backward(int k, TrackedBuffer<float> d_output);
  void run_ops(const std::vector<PipeOp>& ops);
  int recv_peer(const PipeOp& op) const;
  int send_peer(const PipeOp& op) const;
  void reduce_gradients();
  double reported_loss();
};

void PipelineTrainer::Impl::allocate_states() {
  const auto& layout = model.layout();
  std::vector<std::int64_t> held;
  for (std::int64_t u = units.first; u < units.last; ++u) held.push_back(u);
  if (tied_head && last() && !first()) held.push_back(0);  // the head's copy of wte
  for (std::int64_t u : held) {
    UnitState s;
    s.unit = u;
    const std::int64_t n = layout.unit_size_of(u);
    s.params = allocator.allocate_uninitialized<float>(MemoryCategory::parameters, n);
    init_unit_params<float>(layout, u, options.seed, 0, s.params.span());
    s.grads = allocator.allocate<float>(MemoryCategory::gradients, n);
    s.exp_avg = allocator.allocate<float>(MemoryCategory::optimizer_states, n);
    s.exp_avg_sq = allocator.allocate<float>(MemoryCategory::optimizer_states, n);
    states.push_back(std::move(s));
  }
}

// Micro-batch k's forward through this stage's units; returns the output to send on (empty on
// the last stage, which keeps the loss).
TrackedBuffer<float> PipelineTrainer::Impl::forward(int k, TrackedBuffer<float> input) {
  const auto& b = options.micro_batch;
  auto& f = in_flight[static_cast<std::size_t>(k)].emplace();
  if (first() || last()) {
    const std::int64_t d = data.size(), m = options.micro_batches;
    const std::int64_t sequence = steps_done * b.batch * m * d + (k * d + data.rank()) * b.batch;
    f.tokens = synthetic_sequences(allocator, options.seed, sequence, b, options.model.vocab);
  }
  TrackedBuffer<float> x =
      first() ? model.forward_embedding(params(0), f.tokens->inputs.span(), b) : std::move(input);
  for (std::int64_t u = std::max<std::int64_t>(units.first, 1); u < units.last; ++u) {
    if (u == head_unit()) break;
    auto block = model.forward_block(params(u), std::move(x), b, options.checkpointing);
    x = std::move(block.output);
    f.saved.push_back(std::move(block.saved));
  }
  if (!last()) return x;
  const auto embedding = tied_head ? params(0) : std::span<const float>{};
  auto head =
      model.forward_head(params(head_unit()), embedding, std::move(x), f.tokens->targets.span(), b);
  loss_sum += head.loss;
  f.head.emplace(std::move(head.saved));
  return {};
}

// Micro-batch k's backward through this stage's units; returns d input to send back (empty on
// the first stage).
TrackedBuffer<float> PipelineTrainer::Impl::backward(int k, TrackedBuffer<float> d_output) {
  auto& f = *in_flight[static_cast<std::size_t>(k)];
  const double scale = 1.0 / (static_cast<double>(options.micro_batches) * data.size());
  TrackedBuffer<float> dx = std::move(d_output);
  if (last()) {
    auto& head = state(head_unit());
    const auto embedding = tied_head ? params(0) : std::span<const float>{};
    const auto embedding_grad = tied_head ? state(0).grads.span() : std::span<float>{};
    dx = model.backward_head(head.params.span(), embedding, std::move(*f.head),
                             f.tokens->targets.span(), head.grads.span(), embedding_grad, scale);
  }
  for (std::int64_t u = std::min(units.last, head_unit()) - 1;
       u >= std::max<std::int64_t>(units.first, 1); --u) {
    auto& s = state(u);
    dx = model.backward_block(s.params.span(), std::move(f.saved.back()), std::move(dx),
                              s.grads.span());
    f.saved.pop_back();
  }
  if (first()) {
    model.backward_embedding(f.tokens->inputs.span(), std::move(dx), state(0).grads.span(),
                             options.micro_batch);
    in_flight[static_cast<std::size_t>(k)].reset();
    return {};  // nothing to send back
  }
  in_flight[static_cast<std::size_t>(k)].reset();
  return dx;
}

int PipelineTrainer::Impl::recv_peer(const PipeOp& op) const {
  if (op.kind == PipeOpKind::forward) return first() ? -1 : stage() - 1;
  return last() ? -1 : stage() + 1;
}

int PipelineTrainer::Impl::send_peer(const PipeOp& op) const {
  if (op.kind == PipeOpKind::forward) return last() ? -1 : stage() + 1;
  return first() ? -1 : stage() - 1;
}

// The stage's ops in schedule order. A send followed by an op that receives from the same
// neighbour is one exchange; every other send and receive is on its own.
void PipelineTrainer::Impl::run_ops(const std::vector<PipeOp>& ops) {
  const auto n = static_cast<std::size_t>(hidden_elements());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    TrackedBuffer<float> input;
    if (const int from = recv_peer(op); from >= 0) {
      if (received.empty()) {
        const auto start = Clock::now();
        input =
            allocator.allocate_uninitialized<float>(MemoryCategory::activations, hidden_elements());
        pipeline.recv(input.data(), n, comm::DataType::f32, from);
        report.p2p_s += seconds_since(start);
      } else {
        input = std::move(received);
      }
    }
    auto start = Clock::now();
    const bool forward_op = op.kind == PipeOpKind::forward;
    TrackedBuffer<float> output = forward_op ? forward(op.micro_batch, std::move(input))
                                             : backward(op.micro_batch, std::move(input));
    (forward_op ? report.forward_s : report.backward_s) += seconds_since(start);
    const int to = send_peer(op);
    if (to < 0) continue;
    start = Clock::now();
    if (i + 1 < ops.size() && recv_peer(ops[i + 1]) == to) {
      received =
          allocator.allocate_uninitialized<float>(MemoryCategory::activations, hidden_elements());
      pipeline.send_recv(output.data(), n, received.data(), n, comm::DataType::f32, to);
    } else {
      pipeline.send(output.data(), n, comm::DataType::f32, to);
    }
    report.p2p_s += seconds_since(start);
  }
}

// DDP over the stage's ranks, then the tied embedding's two copies summed.
void PipelineTrainer::Impl::reduce_gradients() {
  const auto start = Clock::now();
  if (data.size() > 1)
    for (auto& s : states)
      data.all_reduce(s.grads.data(), s.grads.data(), static_cast<std::size_t>(s.grads.size()),
                      comm::DataType::f32);
  if (tied_head && stages() > 1 && (first() || last())) {
    auto& e = state(0);
    tied.all_reduce(e.grads.data(), e.grads.data(), static_cast<std::size_t>(e.grads.size()),
                    comm::DataType::f32);
  }
  report.reduce_s += seconds_since(start);
}

// The mean of the micro-batch losses over the last stage's data-parallel group, on every rank.
double PipelineTrainer::Impl::reported_loss() {
  double loss = last() ? loss_sum / options.micro_batches : 0.0;
  if (last() && data.size() > 1) {
    data.all_reduce(&loss, &loss, 1, comm::DataType::f64);
    loss /= data.size();
  }
  if (stages() > 1) pipeline.broadcast(&loss, 1, comm::DataType::f64, stages() - 1);
  return loss;
}

PipelineTrainer::PipelineTrainer(PipelineOptions options, TrackedAllocator& allocator,
                                 PipelineGroups& groups) {
  if (!groups.pipeline || !groups.data || !groups.tied)
    throw std::invalid_argument("pipeline: every group is needed");
  const int p = groups.pipeline->size(), world = p * groups.data->size();
  if (p != options.stages)
    throw std::invalid_argument(
        fmt::format("pipeline: a group of {} stages for {} stages", p, options.stages));
  check_pipeline(options, world);
  impl_ = std::make_unique<Impl>(std::move(options), allocator, groups);
  auto& s = *impl_;
  s.units = stage_units(s.options.model.layers, p, s.stage());
  s.tied_head = s.model.layout().head().output == kAbsent;
  s.allocate_states();
}

PipelineTrainer::~PipelineTrainer() = default;

PipelineReport PipelineTrainer::step() {
  auto& s = *impl_;
  const auto start = Clock::now();
  s.report = {};
  s.report.step = s.steps_done + 1;
  s.loss_sum = 0;
  for (auto& u : s.states) std::fill(u.grads.span().begin(), u.grads.span().end(), 0.0f);
  s.in_flight.clear();
  s.in_flight.resize(static_cast<std::size_t>(s.options.micro_batches));
  const auto ops =
      documents::schedule_ops(s.options.schedule, s.stages(), 1,
                              s.options.micro_batches)[static_cast<std::size_t>(s.stage())];
  s.run_ops(ops);
  s.reduce_gradients();
  const auto optimizer_start = Clock::now();
  ++s.steps_done;
  for (auto& u : s.states)
    adamw_step<float>(u.params.span(), u.grads.span(), u.exp_avg.span(), u.exp_avg_sq.span(),
                      s.steps_done, s.options.adamw);
  s.report.optimizer_s = seconds_since(optimizer_start);
  s.report.loss = s.reported_loss();
  s.report.step_s = seconds_since(start);
  return s.report;
}

int PipelineTrainer::stage() const { return impl_->stage(); }
StageUnits PipelineTrainer::units() const { return impl_->units; }
const GptLayout& PipelineTrainer::layout() const { return impl_->model.layout(); }
std::span<const float> PipelineTrainer::parameters(std::int64_t unit) const {
  return impl_->state(unit).params.span();
}

}  // namespace shardplan::executor
