#include "executor/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/mesh.hpp"
#include "documents/pipeline_order.hpp"
#include "executor/param_init.hpp"
#include "executor/synthetic_data.hpp"
#include "executor/tensor_parallel.hpp"
#include "kernels/adamw.hpp"

namespace shardplan::executor {

using kernels::adamw_step;

using core::InputError;
using documents::PipeOp;
using documents::PipeOpKind;

StageUnits chunk_units(std::int64_t layers, int stages, int virtual_stages, int stage, int chunk) {
  const std::int64_t count = static_cast<std::int64_t>(stages) * virtual_stages;
  const std::int64_t per_chunk = layers / count;
  const std::int64_t g = static_cast<std::int64_t>(chunk) * stages + stage;  // virtual stage
  StageUnits u;
  u.first = g == 0 ? 0 : 1 + g * per_chunk;
  u.last = g == count - 1 ? layers + 2 : 1 + (g + 1) * per_chunk;
  return u;
}

StageUnits stage_units(std::int64_t layers, int stages, int stage) {
  return chunk_units(layers, stages, 1, stage, 0);
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
  const int t = o.tensor_parallel;
  if (t < 1) throw InputError("--tensor-parallel", fmt::format("must be >= 1, got {}", t));
  if (world % (static_cast<std::int64_t>(p) * t) != 0)
    throw InputError("--tensor-parallel",
                     fmt::format("{} stages x {} tensor-parallel ranks do not divide the {} ranks "
                                 "of the job",
                                 p, t, world));
  if (t > 1) {
    try {
      check_tensor_parallel(o.model, t);
    } catch (const std::invalid_argument& e) {
      throw InputError("--tensor-parallel", e.what());
    }
  }
  if (o.sequence_parallel && (t == 1 || o.micro_batch.tokens() % t != 0))
    throw InputError("--sequence-parallel",
                     fmt::format("{} tokens per micro-batch do not split over {} tensor-parallel "
                                 "ranks (> 1)",
                                 o.micro_batch.tokens(), t));
  const int v = o.virtual_stages;
  if (o.schedule != documents::PipelineSchedule::interleaved_1f1b) {
    if (v != 1)
      throw InputError("--virtual-stages",
                       fmt::format("{} needs --schedule interleaved-1f1b, got {}", v,
                                   documents::schedule_name(o.schedule)));
    return;
  }
  // Megatron-LM's interleaved schedule: v >= 2 chunks per stage, m a multiple of p
  // (forward_backward_pipelining_with_interleaving). With two stages both neighbours are one rank,
  // and a stage's activations and gradients would share one ordered channel in an order neither
  // list fixes; Megatron-LM long required more than two stages too.
  if (v < 2)
    throw InputError("--virtual-stages",
                     fmt::format("the interleaved-1f1b schedule needs >= 2, got {}", v));
  if (p < 3)
    throw InputError("--pipeline-parallel",
                     fmt::format("the interleaved-1f1b schedule runs on >= 3 stages, got {}", p));
  if (o.model.layers % (static_cast<std::int64_t>(p) * v) != 0)
    throw InputError("--virtual-stages",
                     fmt::format("{} stages x {} chunks do not divide the model's {} layers", p, v,
                                 o.model.layers));
  if (o.micro_batches % p != 0)
    throw InputError("--micro-batches",
                     fmt::format("the interleaved-1f1b schedule needs a multiple of the {} stages, "
                                 "got {}",
                                 p, o.micro_batches));
}

StagePeak stage_peak(const PipelineOptions& o, int stage) {
  if (o.tensor_parallel > 1)
    throw std::invalid_argument("stage_peak counts stages without tensor parallelism");
  const GptLayout layout(o.model);
  const int p = o.stages, v = o.virtual_stages;
  const bool first = stage == 0, last = stage == p - 1;
  const bool tied = layout.head().output == kAbsent;
  const std::int64_t f = sizeof(float), N = o.micro_batch.tokens(), h = o.model.hidden;
  const std::int64_t I = o.model.intermediate;
  const std::int64_t blocks = o.model.layers / (static_cast<std::int64_t>(p) * v);  // per chunk
  const std::int64_t block =
      block_saved_bytes(layout, o.micro_batch, o.checkpointing, o.model_options.flash_attention, f);
  StagePeak peak;
  std::int64_t elements = 0, moments = 0;  // of the stage's units; of rank 0's ranges of them
  auto add_unit = [&](std::int64_t unit) {
    const std::int64_t n = layout.unit_size_of(unit);
    elements += n;
    moments += (n + o.optimizer_shards - 1) / o.optimizer_shards;
  };
  std::vector<std::int64_t> saved(static_cast<std::size_t>(v));  // per chunk and micro-batch
  for (int c = 0; c < v; ++c) {
    const StageUnits u = chunk_units(o.model.layers, p, v, stage, c);
    for (std::int64_t unit = u.first; unit < u.last; ++unit) add_unit(unit);
    const bool first_chunk = first && c == 0, last_chunk = last && c == v - 1;
    auto& bytes = saved[static_cast<std::size_t>(c)];
    bytes = blocks * block;
    if (first_chunk || last_chunk) bytes += 2 * N * static_cast<std::int64_t>(sizeof(std::int32_t));
    if (last_chunk) bytes += head_saved_bytes(layout, o.micro_batch, f);
    peak.saved = std::max(peak.saved, bytes);
  }
  if (tied && last && !first) add_unit(0);
  peak.states = 2 * f * (elements + moments);
  const bool swiglu = o.model.mlp == documents::MlpKind::swiglu;
  if (blocks > 0) peak.transient = (2 * N * h + (swiglu ? 2 : 1) * N * I) * f;
  if (last)
    peak.transient = std::max(peak.transient, head_backward_bytes(layout, o.micro_batch, f));
  if (!last || v > 1) peak.transient = std::max(peak.transient, 2 * N * h * f);
  // The chunks alive at once, in the stage's own order (byte counts far below 2^53: exact in
  // doubles).
  const auto ops = documents::schedule_ops(o.schedule, p, v, o.micro_batches);
  peak.held = static_cast<std::int64_t>(documents::peak_held(
      ops.at(static_cast<std::size_t>(stage)), std::vector<double>(saved.begin(), saved.end())));
  peak.in_flight = documents::peak_chunks(ops).at(static_cast<std::size_t>(stage));
  return peak;
}

PipelineGroups make_pipeline_groups(comm::Communicator& world, int stages, int tensor_parallel) {
  using documents::Dim;
  const int t = tensor_parallel, d = world.size() / (stages * t), rank = world.rank();
  const documents::Mesh m(stages, 1, d, 1, t);  // documents/mesh.hpp
  auto split = [&](std::initializer_list<Dim> dims) {
    const auto s = m.split(rank, dims);
    return world.split(s.color, s.key);
  };
  PipelineGroups g;
  g.pipeline = split({Dim::pipeline});
  g.data = split({Dim::shard});
  g.tensor = split({Dim::tensor});
  // The first and the last stage's ranks at one data and tensor position; every other rank alone.
  const auto pair = m.split(rank, {Dim::pipeline});
  const int stage = pair.key;
  const bool end = stage == 0 || stage == stages - 1;
  g.tied = world.split(end ? pair.color : d * t + rank, stage);
  return g;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Data-parallel rank i's range of a unit of n elements split over `shards` (pipeline.hpp).
std::pair<std::int64_t, std::int64_t> shard_range(std::int64_t n, int shards, int i) {
  const std::int64_t chunk = (n + shards - 1) / shards;
  const std::int64_t begin = std::min(n, i * chunk);
  return {begin, std::min(n, begin + chunk) - begin};
}

}  // namespace

// The Impl's own types are its members' (not in the anonymous namespace: a member of a type with
// linkage may not have a type without it, which GCC checks when this file is one of a unity
// build's includes).
struct PipelineTrainer::Impl {
  struct UnitState {
    std::int64_t unit = 0;
    TrackedBuffer<float> params, grads;        // [unit size] each
    TrackedBuffer<float> exp_avg, exp_avg_sq;  // [length]: the moments of this rank's range
    std::int64_t begin = 0,
                 length = 0;  // the range this rank steps (the whole unit without shards)
  };
  // What one micro-batch keeps from its forward to its backward on this stage.
  struct InFlight {
    std::optional<TokenBatch> tokens;  // first and last stage: inputs, targets
    std::vector<BlockActivations<float>> saved;
    std::optional<HeadActivations<float>> head;
  };

  PipelineOptions options;
  TrackedAllocator& allocator;
  comm::Communicator& pipeline;
  comm::Communicator& data;
  comm::Communicator& tied;
  GptModel<float> model;
  std::vector<StageUnits> chunks;  // [v]: the units of each model chunk on this stage
  bool tied_head = false;
  std::vector<UnitState> states;  // this stage's units; the embedding too on a tied last stage
  std::int64_t steps_done = 0;
  std::vector<std::optional<InFlight>> in_flight;  // [m · v], micro-batch k's chunk c at k·v + c
  TrackedBuffer<float> received;  // an input received ahead by an exchange, for the next step
  double loss_sum = 0;
  PipelineReport report;

  Impl(PipelineOptions o, TrackedAllocator& a, PipelineGroups& g)
      : options(std::move(o)), allocator(a), pipeline(*g.pipeline), data(*g.data), tied(*g.tied),
        model(options.model, allocator, options.model_options) {}

  int stage() const { return pipeline.rank(); }
  int stages() const { return pipeline.size(); }
  int chunk_count() const { return options.virtual_stages; }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  // Chunk c is the model's first (the embedding's) or last (the head's) virtual stage.
  bool first_chunk(int c) const { return first() && c == 0; }
  bool last_chunk(int c) const { return last() && c == chunk_count() - 1; }
  InFlight& held(int k, int c) {
    return *in_flight[static_cast<std::size_t>(k) * static_cast<std::size_t>(chunk_count()) +
                      static_cast<std::size_t>(c)];
  }
  std::optional<InFlight>& slot(int k, int c) {
    return in_flight[static_cast<std::size_t>(k) * static_cast<std::size_t>(chunk_count()) +
                     static_cast<std::size_t>(c)];
  }
  std::int64_t head_unit() const { return options.model.layers + 1; }
  // The hidden states between units: [N, h], or this rank's N/t tokens under sequence
  // parallelism.
  std::int64_t hidden_elements() const {
    const auto& tp = options.model_options.tensor_parallel;
    const std::int64_t tokens = options.micro_batch.tokens();
    return (tp.sequence_parallel ? tokens / tp.size() : tokens) * options.model.hidden;
  }

  UnitState& state(std::int64_t unit) {
    for (auto& s : states)
      if (s.unit == unit) return s;
    throw std::out_of_range(fmt::format("unit {} is not on pipeline stage {}", unit, stage()));
  }
  std::span<const float> params(std::int64_t unit) { return state(unit).params.span(); }

  void allocate_states();
  TrackedBuffer<float> forward(int k, int c, TrackedBuffer<float> input);
  TrackedBuffer<float> backward(int k, int c, TrackedBuffer<float> d_output);
  void run_ops(const std::vector<PipeOp>& ops);
  int recv_peer(const PipeOp& op) const;
  int send_peer(const PipeOp& op) const;
  void reduce_gradients();
  void gather_parameters();
  double reported_loss();
};

void PipelineTrainer::Impl::allocate_states() {
  const auto& layout = model.layout();
  std::vector<std::int64_t> held;
  for (const auto& chunk : chunks)
    for (std::int64_t u = chunk.first; u < chunk.last; ++u) held.push_back(u);
  if (tied_head && last() && !first()) held.push_back(0);  // the head's copy of wte
  for (std::int64_t u : held) {
    UnitState s;
    s.unit = u;
    const std::int64_t n = layout.unit_size_of(u);
    s.params = allocator.allocate_uninitialized<float>(MemoryCategory::parameters, n);
    const auto& tp = options.model_options.tensor_parallel;
    if (tp.active())  // this rank's slice of the whole model's initial values
      init_local_params<float>(tp, layout, u, options.seed, 0, s.params.span());
    else
      init_unit_params<float>(layout, u, options.seed, 0, s.params.span());
    s.grads = allocator.allocate<float>(MemoryCategory::gradients, n);
    // Without shards (DDP) every rank steps the whole unit.
    const int owner = options.optimizer_shards > 1 ? data.rank() : 0;
    std::tie(s.begin, s.length) = shard_range(n, options.optimizer_shards, owner);
    s.exp_avg = allocator.allocate<float>(MemoryCategory::optimizer_states, s.length);
    s.exp_avg_sq = allocator.allocate<float>(MemoryCategory::optimizer_states, s.length);
    states.push_back(std::move(s));
  }
}

// Micro-batch k's forward through chunk c's units; returns the output to send on (empty on the
// last chunk, which keeps the loss).
TrackedBuffer<float> PipelineTrainer::Impl::forward(int k, int c, TrackedBuffer<float> input) {
  const auto& b = options.micro_batch;
  const StageUnits& units = chunks[static_cast<std::size_t>(c)];
  auto& f = slot(k, c).emplace();
  if (first_chunk(c) || last_chunk(c)) {
    const std::int64_t d = data.size(), m = options.micro_batches;
    const std::int64_t sequence = steps_done * b.batch * m * d + (k * d + data.rank()) * b.batch;
    f.tokens = synthetic_sequences(allocator, options.seed, sequence, b,
                                   options.model_options.tensor_parallel.vocab(options.model));
  }
  TrackedBuffer<float> x = first_chunk(c)
                               ? model.forward_embedding(params(0), f.tokens->inputs.span(), b)
                               : std::move(input);
  for (std::int64_t u = std::max<std::int64_t>(units.first, 1); u < units.last; ++u) {
    if (u == head_unit()) break;
    auto block = model.forward_block(params(u), std::move(x), b, options.checkpointing);
    x = std::move(block.output);
    f.saved.push_back(std::move(block.saved));
  }
  if (!last_chunk(c)) return x;
  const auto embedding = tied_head ? params(0) : std::span<const float>{};
  auto head =
      model.forward_head(params(head_unit()), embedding, std::move(x), f.tokens->targets.span(), b);
  loss_sum += head.loss;
  f.head.emplace(std::move(head.saved));
  return {};
}

// Micro-batch k's backward through chunk c's units; returns d input to send back (empty on the
// first chunk).
TrackedBuffer<float> PipelineTrainer::Impl::backward(int k, int c, TrackedBuffer<float> d_output) {
  auto& f = held(k, c);
  const StageUnits& units = chunks[static_cast<std::size_t>(c)];
  const double scale = 1.0 / (static_cast<double>(options.micro_batches) * data.size());
  TrackedBuffer<float> dx = std::move(d_output);
  if (last_chunk(c)) {
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
  if (first_chunk(c)) {
    model.backward_embedding(f.tokens->inputs.span(), std::move(dx), state(0).grads.span(),
                             options.micro_batch);
    slot(k, c).reset();
    return {};  // nothing to send back
  }
  slot(k, c).reset();
  return dx;
}

// A forward receives from the stage before it in the ring of virtual stages (chunk c of stage s
// follows chunk c − 1 of stage p − 1 when s = 0) and sends to the one after it; a backward the
// other way round.
int PipelineTrainer::Impl::recv_peer(const PipeOp& op) const {
  const int p = stages();
  if (op.kind == PipeOpKind::forward) return first_chunk(op.chunk) ? -1 : (stage() + p - 1) % p;
  return last_chunk(op.chunk) ? -1 : (stage() + 1) % p;
}

int PipelineTrainer::Impl::send_peer(const PipeOp& op) const {
  const int p = stages();
  if (op.kind == PipeOpKind::forward) return last_chunk(op.chunk) ? -1 : (stage() + 1) % p;
  return first_chunk(op.chunk) ? -1 : (stage() + p - 1) % p;
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
    TrackedBuffer<float> output = forward_op ? forward(op.micro_batch, op.chunk, std::move(input))
                                             : backward(op.micro_batch, op.chunk, std::move(input));
    (forward_op ? report.forward_s : report.backward_s) += seconds_since(start);
    const int to = send_peer(op);
    if (to < 0) continue;
    start = Clock::now();
    // With model chunks the stages form a ring: a send on to one neighbour and the next step's
    // receive from the other are one exchange too, as Megatron's send_forward_recv_forward.
    const int from = i + 1 < ops.size() ? recv_peer(ops[i + 1]) : -1;
    if (from >= 0 && (from == to || chunk_count() > 1)) {
      received =
          allocator.allocate_uninitialized<float>(MemoryCategory::activations, hidden_elements());
      pipeline.send_recv(output.data(), n, to, received.data(), n, from, comm::DataType::f32);
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

// With the distributed optimizer: each data-parallel rank's updated range, to the others.
void PipelineTrainer::Impl::gather_parameters() {
  if (options.optimizer_shards == 1) return;
  const auto start = Clock::now();
  for (auto& u : states) {
    const std::int64_t n = u.params.size();
    for (int i = 0; i < options.optimizer_shards; ++i) {
      const auto [begin, length] = shard_range(n, options.optimizer_shards, i);
      if (length > 0)
        data.broadcast(u.params.data() + begin, static_cast<std::size_t>(length),
                       comm::DataType::f32, i);
    }
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
  if (!groups.pipeline || !groups.data || !groups.tied || !groups.tensor)
    throw std::invalid_argument("pipeline: every group is needed");
  const int p = groups.pipeline->size(), t = groups.tensor->size();
  const int world = p * groups.data->size() * t;
  if (p != options.stages || t != options.tensor_parallel)
    throw std::invalid_argument(
        fmt::format("pipeline: groups of {} stages and {} tensor-parallel ranks for {} and {}", p,
                    t, options.stages, options.tensor_parallel));
  check_pipeline(options, world);
  if (options.optimizer_shards != 1 && options.optimizer_shards != groups.data->size())
    throw std::invalid_argument(
        fmt::format("pipeline: optimizer moments split over {} ranks, the stage has {}",
                    options.optimizer_shards, groups.data->size()));
  if (t > 1) {  // the stage runs this rank's local model (tensor_parallel.hpp)
    options.model_options.tensor_parallel = {groups.tensor.get(), options.sequence_parallel,
                                             std::make_shared<const GptLayout>(options.model)};
    options.model = local_spec(options.model, t);
  }
  impl_ = std::make_unique<Impl>(std::move(options), allocator, groups);
  auto& s = *impl_;
  for (int c = 0; c < s.chunk_count(); ++c)
    s.chunks.push_back(chunk_units(s.options.model.layers, p, s.chunk_count(), s.stage(), c));
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
  s.in_flight.resize(static_cast<std::size_t>(s.options.micro_batches) *
                     static_cast<std::size_t>(s.chunk_count()));
  const auto ops =
      documents::schedule_ops(s.options.schedule, s.stages(), s.chunk_count(),
                              s.options.micro_batches)[static_cast<std::size_t>(s.stage())];
  s.run_ops(ops);
  s.reduce_gradients();
  const auto optimizer_start = Clock::now();
  ++s.steps_done;
  for (auto& u : s.states)
    adamw_step<float>(u.params.span().subspan(static_cast<std::size_t>(u.begin),
                                              static_cast<std::size_t>(u.length)),
                      u.grads.span().subspan(static_cast<std::size_t>(u.begin),
                                             static_cast<std::size_t>(u.length)),
                      u.exp_avg.span(), u.exp_avg_sq.span(), s.steps_done, s.options.adamw);
  s.report.optimizer_s = seconds_since(optimizer_start);
  s.gather_parameters();
  s.report.loss = s.reported_loss();
  s.report.step_s = seconds_since(start);
  return s.report;
}

int PipelineTrainer::stage() const { return impl_->stage(); }
std::vector<StageUnits> PipelineTrainer::units() const { return impl_->chunks; }
const GptLayout& PipelineTrainer::layout() const { return impl_->model.layout(); }
std::span<const float> PipelineTrainer::parameters(std::int64_t unit) const {
  return impl_->state(unit).params.span();
}

}  // namespace shardplan::executor
