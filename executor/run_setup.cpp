#include "executor/run_setup.hpp"

#include <memory>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/recipe.hpp"
#include "executor/host_offload.hpp"
#include "executor/model_layout.hpp"
#include "executor/tensor_parallel.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::bf16;

using core::InputError;

namespace {

// Refuses a plan this executor cannot run as planned.
void check_runnable(const documents::Plan& p, int world, const RunRequest& request) {
  const auto& job = p.job;
  const char* executor = request.gpu ? "the GPU executor" : "the CPU executor";
  if (job.precision == documents::Precision::bf16)
    throw InputError(
        "/job/precision",
        fmt::format("{} runs fp32, bf16-mixed and fp16-mixed, got \"bf16\" (bf16 optimizer "
                    "states); plan with --precision bf16-mixed",
                    executor));
  if (job.optimizer != documents::Optimizer::adamw)
    throw InputError("/job/optimizer", fmt::format("the executor runs adamw only, got \"{}\"",
                                                   documents::optimizer_name(job.optimizer)));
  // The host's kernels compute in 32 and 16 bits, and the GPU backend's too: nothing it runs is a
  // GEMM on fp8 operands.
  if (job.float8 != documents::Float8Recipe::none)
    throw InputError("/job/float8",
                     fmt::format("{} runs no fp8 GEMMs (its kernels compute in 32 and 16 bits), "
                                 "got \"{}\"; plan without --float8",
                                 executor, documents::float8_recipe_name(job.float8)));
  if (documents::recipe_traits(job.recipe).framework)
    throw InputError(
        "/job/recipe",
        fmt::format("the executor runs its own model code, planned as recipe \"executor\", "
                    "got \"{}\"; plan with --recipe executor",
                    documents::recipe_name(job.recipe)));
  if (!documents::recipe_traits(job.recipe).runs_under(p.spec.flavour))
    throw InputError("/sharding/flavour",
                     fmt::format("the executor's engine runs {}, got \"{}\"",
                                 documents::recipe_traits(job.recipe).flavour_list(),
                                 documents::flavour_name(p.spec.flavour)));
  if (p.spec.fp32_gathered)
    throw InputError("/sharding/fp32_gathered",
                     "the executor gathers parameters in the compute dtype (its engine has no "
                     "autocast), got true");
  if (job.checkpointing != documents::Checkpointing::none &&
      job.checkpointing != documents::Checkpointing::full)
    throw InputError("/job/checkpointing",
                     fmt::format("the executor checkpoints every block or none, got \"{}\"; plan "
                                 "with --checkpointing none or full",
                                 documents::checkpointing_label(job)));
  if (job.loss != documents::LossImpl::upcast)
    throw InputError("/job/loss", fmt::format("the executor's loss is upcast, got \"{}\"",
                                              documents::loss_label(job)));
  if (p.spec.offload != documents::Offload::none && request.gpu)
    throw InputError("/sharding/offload",
                     fmt::format("{} does not offload (the CPU executor does), got \"{}\"",
                                 executor, documents::offload_name(p.spec.offload)));
  try {
    (void)offload_policy(p.spec);
  } catch (const std::invalid_argument& error) {
    throw InputError("/sharding/offload", error.what());
  }
  if (p.spec.shard_parameters && !p.spec.shard_gradients)
    throw InputError("/sharding/shard_parameters",
                     "true needs shard_gradients true (no framework does otherwise)");
  if (p.cluster.gpus != world)
    throw InputError("/cluster/gpus", fmt::format("the plan is for {} ranks, the run has {}",
                                                  p.cluster.gpus, world));
  if (const int S = p.spec.group(world); S > world || world % S != 0)
    throw InputError(
        "/sharding/shard_group_size",
        fmt::format("a shard group of {} ranks does not divide the {} ranks", S, world));
  if (p.model.architecture == documents::Architecture::uniform)
    throw InputError(
        "/model", fmt::format("\"{}\" is a bare parameter count: there is no architecture to run",
                              p.model.name));
}

// The engine's options from the plan, scaled down as the request asks.
void set_engine_options(RunSetup& r, int world, const RunRequest& request) {
  const auto& p = r.plan;
  const auto& job = p.job;
  auto& e = r.engine;
  e.model = p.model;
  if (request.scale) {
    e.model = scale_down(p.model, *request.scale);
    r.scaled = true;
  }
  GptLayout check(e.model);  // throws for what the model cannot build
  e.spec = p.spec;
  e.micro_batch = {job.micro_batch, job.seq_len};
  if (request.scale_seq) {
    if (*request.scale_seq < 1)
      throw InputError("--seq-len", fmt::format("must be >= 1, got {}", *request.scale_seq));
    e.micro_batch.seq = *request.scale_seq;
    r.scaled = r.scaled || *request.scale_seq != job.seq_len;
  }
  if (e.model.positions == documents::PositionKind::learned &&
      e.micro_batch.seq > e.model.max_positions)
    throw InputError("/job/seq_len",
                     fmt::format("{} tokens exceed the model's {} learned positions",
                                 e.micro_batch.seq, e.model.max_positions));
  e.grad_accumulation = job.global_batch / (world * job.micro_batch);
  r.global_batch = job.global_batch;
  e.checkpointing = job.checkpointing == documents::Checkpointing::full ? Checkpointing::full
                                                                        : Checkpointing::none;
  e.adamw.lr = request.lr;
  e.seed = request.seed;
  // On a GPU (and with collective streams on CPUs) the collectives are queued on their own
  // streams: the gathers are issued ahead as the plan says, as the frameworks do.
  e.prefetch_as_planned = request.prefetch_as_planned || request.gpu || request.collective_streams;
  e.model_options.flash_attention = job.attention == documents::AttentionImpl::flash;
  e.precision = job.precision;
  try {
    (void)precision_policy(job.precision, p.spec);
  } catch (const std::invalid_argument& error) {
    throw InputError("/sharding/reduce_dtype", error.what());
  }
}

// Where the run departs from the plan's prediction, said in the run document.
void add_deviations(RunSetup& r) {
  const auto& p = r.plan;
  const auto& job = p.job;
  const auto& e = r.engine;
  // fp32 gradients are reduced in fp32 whatever the plan's reduce dtype (the cost model reduces
  // in max(reduce_dtype, compute dtype) too); mixed precision reduces as the cost model does or
  // is refused by the engine.
  if (job.precision == documents::Precision::fp32 && p.spec.reduce_dtype != documents::DType::fp32)
    r.deviations.push_back(
        fmt::format("gradients are reduced in fp32, not {} (/sharding/reduce_dtype): the "
                    "gradients of an fp32 job are fp32",
                    documents::dtype_name(p.spec.reduce_dtype)));
  if (p.model.attention_dropout || p.model.residual_dropout)
    r.deviations.push_back(
        "dropout is not applied (the executor trains deterministically); the prediction "
        "counts its masks");
  if (p.spec.shard_parameters && !e.prefetch_as_planned &&
      (p.spec.forward_prefetch > 0 || p.spec.backward_prefetch > 0))
    r.deviations.push_back(
        "all-gathers are issued when a unit is about to run, not prefetched: MPI collectives "
        "block the computing thread, as the cost model's CPU profile assumes "
        "(--prefetch-as-planned issues them ahead; --collective-streams also runs them beside "
        "the compute)");
  if (r.scaled)
    r.deviations.push_back(
        "the model or sequence was scaled down on the command line: the plan's prediction "
        "is for the unscaled model");
}

// Tensor parallelism: the engine runs this rank's local model, its data parallelism over the
// d = world / t replicas (the TP group is made by the run, tensor_parallel.hpp).
void set_tensor_parallel(RunSetup& r, int world, const RunRequest& request) {
  const int t = request.tensor_parallel;
  auto& e = r.engine;
  if (world % t != 0)
    throw InputError("--tensor-parallel", fmt::format("{} does not divide the {} ranks", t, world));
  if (request.gpu)
    throw InputError("--tensor-parallel",
                     fmt::format("{}: tensor parallelism runs on the cpu backend only", t));
  try {
    check_tensor_parallel(e.model, t);
  } catch (const std::invalid_argument& error) {
    throw InputError("--tensor-parallel", error.what());
  }
  if (request.sequence_parallel && e.micro_batch.tokens() % t != 0)
    throw InputError("--sequence-parallel",
                     fmt::format("{} tokens per micro-batch are not divisible by {} ranks",
                                 e.micro_batch.tokens(), t));
  const int d = world / t;
  const auto& job = r.plan.job;
  if (job.global_batch % (static_cast<std::int64_t>(d) * job.micro_batch) != 0)
    throw InputError("--tensor-parallel",
                     fmt::format("{}: the global batch of {} is not a multiple of {} replicas × "
                                 "micro-batch {}",
                                 t, job.global_batch, d, job.micro_batch));
  e.grad_accumulation = job.global_batch / (d * job.micro_batch);
  e.model_options.tensor_parallel = {nullptr, request.sequence_parallel,
                                     std::make_shared<const GptLayout>(e.model)};
  e.model = local_spec(e.model, t);
  r.deviations.push_back(fmt::format(
      "tensor parallelism over {} ranks{} beside {} data-parallel replicas (vocabulary-parallel "
      "embedding and head); the plan's prediction is for data parallelism alone",
      t, request.sequence_parallel ? " with sequence parallelism" : "", d));
}

// Context parallelism: c ranks share each sequence (context_parallel.hpp), the engine's data
// parallelism over the d·c ranks with the same TP rank, d = world / (c·t) replicas each reading
// whole micro-batches; the groups are made by the run.
void set_context_parallel(RunSetup& r, int world, const RunRequest& request) {
  const int c = request.context_parallel, t = request.tensor_parallel;
  auto& e = r.engine;
  const auto& job = r.plan.job;
  if (world % (c * t) != 0)
    throw InputError(
        "--context-parallel",
        fmt::format("{} × tensor-parallel {} does not divide the {} ranks", c, t, world));
  if (e.model.positions != documents::PositionKind::rotary)
    throw InputError("--context-parallel",
                     fmt::format("{}: ring attention runs rotary models; {} has learned positions",
                                 c, e.model.name));
  if (!e.model_options.flash_attention)
    throw InputError("/job/attention", fmt::format("context parallelism {} runs ring attention on "
                                                   "flash attention, got \"eager\"",
                                                   c));
  if (e.micro_batch.seq % (2 * std::int64_t{c}) != 0)
    throw InputError(request.scale_seq ? "--seq-len" : "/job/seq_len",
                     fmt::format("a sequence of {} tokens does not split into 2 × {} chunks "
                                 "(context parallelism's load-balanced split)",
                                 e.micro_batch.seq, c));
  const int d = world / (c * t);
  if (job.global_batch % (static_cast<std::int64_t>(d) * job.micro_batch) != 0)
    throw InputError("--context-parallel",
                     fmt::format("{}: the global batch of {} is not a multiple of {} replicas × "
                                 "micro-batch {}",
                                 c, job.global_batch, d, job.micro_batch));
  e.grad_accumulation = job.global_batch / (d * job.micro_batch);
  e.micro_batch.seq /= c;  // the rank's share of each sequence
  if (r.plan.parallel.context_parallel != c)
    r.deviations.push_back(fmt::format(
        "context parallelism over {} ranks beside {} data-parallel replicas; the plan's "
        "prediction is for context parallelism {}",
        c, d, r.plan.parallel.context_parallel));
}

}  // namespace

RunSetup make_run_setup(const nlohmann::json& plan_document, int world, const RunRequest& request) {
  RunSetup r;
  r.plan = documents::plan_from_json(plan_document);
  r.world = world;
  check_runnable(r.plan, world, request);
  set_engine_options(r, world, request);
  if (request.tensor_parallel > 1) set_tensor_parallel(r, world, request);
  if (request.context_parallel > 1) set_context_parallel(r, world, request);
  add_deviations(r);
  return r;
}

double least_rank_bytes(const RunSetup& setup) {
  const auto& e = setup.engine;
  const double element = documents::dtype_bytes(documents::compute_dtype(e.precision));
  const double accumulate = 4;  // accum_t<S> of float, bf16 and f16 (gpt_model.hpp)
  const double tokens =
      static_cast<double>(e.micro_batch.seq) * static_cast<double>(e.micro_batch.batch);
  const double params = static_cast<double>(e.model.total_params()) * 4.0 / setup.world;
  // head_saved_bytes' logits in S and log-probabilities in accum_t<S>, [N, V] each.
  const double head = tokens * static_cast<double>(e.model.vocab) * (element + accumulate);
  // A block's input and output [N, h] in S, the least block_saved_bytes keeps (full checkpointing).
  const double block = 2.0 * tokens * static_cast<double>(e.model.hidden) * element;
  return params + block + head;
}

void check_run_size(const RunSetup& setup, const RunRequest& request, double host_memory_bytes) {
  const double need = least_rank_bytes(setup);
  if (!(host_memory_bytes > 0 && need > host_memory_bytes)) return;
  const std::string limit =
      fmt::format("this host's {:.1f} GiB of memory", host_memory_bytes / 1073741824.0);
  const auto& e = setup.engine;
  const std::string what =
      fmt::format("micro-batches of {} sequences of {} tokens of {} need at least {:.3g} bytes per "
                  "rank, more than {}",
                  e.micro_batch.batch, e.micro_batch.seq, e.model.name, need, limit);
  if (request.scale_seq) throw InputError("--seq-len", what);
  if (request.scale) throw InputError("--layers", what);
  throw InputError("/job/seq_len", what);
}

}  // namespace shardplan::executor
