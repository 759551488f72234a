#include "executor/run_command.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/fault_injection.hpp"
#include "comm/host_stream.hpp"
#include "comm/launch_env.hpp"
#include "comm/process_identity.hpp"
#include "comm/topology.hpp"
#include "comm/watchdog.hpp"
#include "comm/watched_communicator.hpp"
#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "core/text.hpp"
#include "core/whole_count.hpp"
#include "documents/hardware.hpp"
#include "executor/checkpoint.hpp"
#include "executor/context_parallel.hpp"
#include "executor/device_run.hpp"
#include "executor/engine.hpp"
#include "executor/run_document.hpp"
#include "executor/stand_in_communicator.hpp"
#include "kernels/caching_pool.hpp"
#include "kernels/host_stream_memory.hpp"
#include "kernels/memory_source.hpp"

#if defined(SHARDPLAN_HAVE_MPI)
#include "comm/mpi_environment.hpp"
#endif
#if defined(SHARDPLAN_HAVE_NCCL)
#include "comm/nccl_communicator.hpp"
#endif

namespace shardplan::executor {

using kernels::MemorySource;
using kernels::PoolExhausted;
using kernels::StreamOrderedHostMemory;
namespace {

using core::InputError;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The device size the run behaves like: --gpu-memory-GiB, else the size the plan was made for
// (planner --gpu-memory-GiB, the plan's /capacity/gpu_memory_GiB), else no limit.
std::optional<double> capacity_GiB(const RunCommand& c, const documents::Plan& plan) {
  return c.capacity_GiB ? c.capacity_GiB : plan.gpu_memory_GiB;
}

std::int64_t capacity_bytes(const RunCommand& c, const documents::Plan& plan) {
  // Both are <= 1e6 GiB (command_line.cpp, documents/plan.cpp): the bytes are a count.
  const auto gib = capacity_GiB(c, plan);
  return gib ? *core::rounded_count(*gib * kGiB) : TrackedAllocator::kUnlimited;
}

// Rank 0 writes the run document: its destination is checked before the first step, and every
// rank learns the verdict (rank 0 says why; finish_rank prints rank 0's InputError only).
[[maybe_unused]] void check_out_on_rank_0(comm::Communicator& world, const RunCommand& c) {
  std::optional<InputError> error;
  if (world.rank() == 0) {
    try {
      core::check_destination(c.out, "--out");
    } catch (const InputError& e) {
      error = e;
    }
  }
  std::int32_t failed = error ? 1 : 0;
  world.broadcast(&failed, 1, comm::DataType::i32, 0);
  if (error) throw *error;
  if (failed) throw InputError("--out", "rank 0 cannot write it");
}

std::string oom_line(const char* what, int rank, double predicted_peak, const std::string& phase) {
  return fmt::format("executor: rank {} on {}: {} in phase '{}'; the plan predicts a peak of "
                     "{:.2f} GiB ({:.0f} bytes) per rank",
                     rank, comm::host_name(), what, phase, predicted_peak / kGiB, predicted_peak);
}

// A fault for a rank the run does not have would never happen: the test that asked is wrong.
// Checkpoints hold fp32 parameters and moments (checkpoint.hpp): a mixed-precision run has none.
void check_checkpoints(const RunCommand& c, const RunSetup& setup) {
  const bool save = !c.checkpoint.save_dir.empty(), resume = !c.checkpoint.resume_dir.empty();
  if ((save || resume) && setup.engine.precision != documents::Precision::fp32)
    throw core::InputError(
        save ? "--save" : "--resume",
        fmt::format("checkpoints hold fp32 runs only, the plan's precision is \"{}\"",
                    documents::precision_name(setup.engine.precision)));
  // An offloaded run's master weights and moments are in the host pool (host_offload.hpp),
  // which checkpoints do not read or restore.
  if ((save || resume) && setup.engine.spec.offload != documents::Offload::none)
    throw core::InputError(
        save ? "--save" : "--resume",
        fmt::format("checkpoints hold runs without offload, the plan offloads \"{}\"",
                    documents::offload_name(setup.engine.spec.offload)));
}

void check_fault_rank(const RunCommand& c, int world_size) {
  if (c.fault && c.fault->rank >= world_size)
    throw InputError("--inject-fault", fmt::format("rank {} is not one of the run's {} ranks",
                                                   c.fault->rank, world_size));
}

struct Measured {
  std::unique_ptr<ShardingEngine> engine;
  RankRecord record;
};

// Runs the steps of one rank. device: the GPU of the CUDA backend (nullptr on CPUs).
Measured run_steps(const RunSetup& setup, TrackedAllocator& allocator, EngineGroups groups,
                   int rank, std::int64_t steps, bool report, comm::Watchdog& watchdog,
                   const std::optional<comm::FaultInjection>& fault, DeviceRun* device,
                   RunCheckpoints* checkpoints = nullptr) {
  Measured m;
  auto options = setup.engine;
  options.watchdog = &watchdog;
  if (device != nullptr) device->attach(options);
  watchdog.set_phase("allocating the parameters and optimizer states");
  m.engine = std::make_unique<ShardingEngine>(options, allocator, groups);
  if (checkpoints) {
    watchdog.set_phase("resuming from the checkpoint and hashing the parameters");
    checkpoints->start(*m.engine);
  }
  // A resumed run goes on counting from the checkpoint's step: its progress reads "step 3/4" for
  // the first of 2 steps after step 2.
  const std::int64_t last_step = m.engine->steps_done() + steps;
  for (std::int64_t k = 0; k < steps; ++k) {
    const std::int64_t step = m.engine->steps_done() + 1;
    watchdog.set_phase(fmt::format("step {}", step));
    // An injected out-of-memory takes the free capacity away: the step's first allocation fails.
    comm::inject_due_fault(fault, rank, step, watchdog,
                           [&allocator] { allocator.set_capacity(allocator.in_use_bytes()); });
    auto r = m.engine->step();
    if (report)
      std::cerr << fmt::format("executor: step {}/{}: loss {:.4f}, {:.3f} s, peak {:.1f} MiB\n",
                               r.step, last_step, r.loss, r.step_s,
                               static_cast<double>(allocator.peak_bytes()) / (1 << 20));
    m.record.steps.push_back(r);
    if (checkpoints) {
      watchdog.set_phase(fmt::format("saving or hashing after step {}", r.step));
      checkpoints->after_step(*m.engine, k + 1 == steps);
    }
  }
  m.record.rank = rank;
  m.record.peak_bytes = allocator.peak_bytes();
  m.record.at_peak = allocator.breakdown_at_peak();
  for (auto c : kMemoryCategories) m.record.category_peaks[c] = allocator.peak_bytes(c);
  m.record.capacity_bytes = allocator.capacity_bytes();
  if (device != nullptr) {
    const auto f = device->footprint();
    m.record.reserved_peak_bytes = f.reserved_peak_bytes;
    m.record.context_bytes = f.context_bytes;
    m.record.nccl_bytes = f.nccl_bytes;
  }
  return m;
}

// Every rank's record to every rank: one all-gather of fixed-length vectors, in memory the
// world's collectives use (the host's for MPI, the GPU's for NCCL).
std::vector<RankRecord> exchange_records(comm::Communicator& world, const RankRecord& mine) {
  const auto packed = pack(mine);
  const std::size_t bytes = packed.size() * sizeof(double);
  auto buffer = world.allocate(bytes * static_cast<std::size_t>(world.size()));
  buffer->copy_from_host(packed.data(), bytes, bytes * static_cast<std::size_t>(world.rank()));
  auto* base = static_cast<unsigned char*>(buffer->data());
  world.all_gather(base + bytes * static_cast<std::size_t>(world.rank()), base, packed.size(),
                   comm::DataType::f64);
  world.synchronize();
  std::vector<double> all(packed.size() * static_cast<std::size_t>(world.size()));
  buffer->copy_to_host(all.data(), all.size() * sizeof(double));
  std::vector<RankRecord> records;
  for (int r = 0; r < world.size(); ++r) {
    const auto from = all.begin() + static_cast<std::ptrdiff_t>(r * packed.size());
    records.push_back(
        unpack({from, from + static_cast<std::ptrdiff_t>(packed.size())}, mine.steps.size()));
  }
  return records;
}

// The dense peak of the plan's hardware for the run's compute dtype, for the MFU; 0 when the
// profile the plan names cannot be read from here.
double peak_flops_of(const RunSetup& setup) {
  try {
    return documents::load_hardware(setup.plan.hardware)
        .peak(documents::compute_dtype(setup.plan.job.precision));
  } catch (const std::exception&) {
    return 0;
  }
}

// Rank 0 writes the run document and says what it measured.
void write_run_document(const RunCommand& c, const RunSetup& setup, const ShardingEngine& engine,
                        const std::vector<RankRecord>& records, RunEnvironment env,
                        RunCheckpoints* checkpoints) {
  env.peak_flops = peak_flops_of(setup);
  auto doc = run_document(setup, engine, records, env);
  if (checkpoints) checkpoints->report(doc);
  core::write_file(c.out, core::json_text(doc, 2) + "\n", "--out");
  const auto& time = doc["summary"]["time"];
  std::cerr << fmt::format(
      "executor: wrote {}: {}peak {:.1f} MiB (predicted {:.1f} MiB), step "
      "{:.3f} s (predicted {:.3f} s){}\n",
      c.out,
      env.rehearsal ? fmt::format("rehearsal of rank {} of {}: ", env.rehearsed_rank, setup.world)
                    : "",
      doc["summary"]["memory"]["peak_bytes"].get<double>() / (1 << 20),
      setup.plan.prediction.peak_bytes / (1 << 20), time["step_s"].get<double>(),
      setup.plan.prediction.step_s,
      time.contains("mfu") ? fmt::format(", MFU {:.1f}%", 100 * time["mfu"].get<double>()) : "");
}

RunRequest request_of(const RunCommand& c) {
  RunRequest r = c.request;
  r.gpu = c.backend == ComputeBackend::cuda;
  return r;
}

// A plan made with model parallelism (its /parallel object) runs with that layout or not at all:
// the flags must ask for the same tensor-parallel size, sequence parallelism, pipeline stages and
// schedule (and micro-batches, when given), and context-parallel size. A data-parallel plan
// may still be run with --tensor-parallel, --context-parallel or --pipeline-parallel (the run
// document says its prediction is for data parallelism alone).
void check_plan_layout(const RunCommand& c, const documents::ParallelLayout& l) {
  if (l.trivial()) return;
  // The executor's stages hold layers / p blocks each (pipeline.hpp).
  if (l.first_stage_less_layers > 0 || l.last_stage_less_layers > 0)
    throw InputError(c.plan,
                     fmt::format("the plan's /parallel split counts the embeddings and the head "
                                 "as {} and {} blocks; the executor splits the blocks alone, "
                                 "evenly",
                                 l.first_stage_less_layers, l.last_stage_less_layers));
  const auto& p = c.pipeline;
  const bool same =
      l.tensor_parallel == c.request.tensor_parallel &&
      l.context_parallel == c.request.context_parallel &&
      l.sequence_parallel == c.request.sequence_parallel && l.pipeline_parallel == p.stages &&
      (l.pipeline_parallel == 1 ||
       (l.schedule == p.schedule && (p.micro_batches == 0 || p.micro_batches == l.micro_batches)));
  if (same) return;
  std::string flags = fmt::format("--tensor-parallel {}", l.tensor_parallel);
  if (l.sequence_parallel) flags += " --sequence-parallel";
  if (l.context_parallel > 1) flags += fmt::format(" --context-parallel {}", l.context_parallel);
  if (l.pipeline_parallel > 1)
    flags +=
        fmt::format(" --pipeline-parallel {} --schedule {} --micro-batches {}", l.pipeline_parallel,
                    documents::schedule_name(l.schedule), l.micro_batches);
  throw InputError(c.plan, fmt::format("the plan's /parallel layout is run with {}", flags));
}

// The plan's setup for a world of world_size ranks (the plan's errors name its file), refused
// before anything is allocated when one rank of it cannot fit this host (run_setup.hpp,
// check_run_size).
RunSetup read_setup(const RunCommand& c, int world_size) {
  const auto request = request_of(c);
  RunSetup setup = core::read_json_document(c.plan, [&](const nlohmann::json& plan) {
    return make_run_setup(plan, world_size, request);
  });
  check_plan_layout(c, setup.plan.parallel);
  check_run_size(setup, request, comm::host_memory_bytes().value_or(0));
  return setup;
}

// Whatever ends a rank's run: the exit code, after the rank's line. The watchdog's end_job ends
// the whole job (MPI_Abort, or this process where there is no MPI).
int finish_rank(const std::exception_ptr& failure, int rank, double predicted_peak,
                comm::Watchdog& watchdog) {
  try {
    std::rethrow_exception(failure);
  } catch (const InputError& e) {
    if (rank == 0) std::cerr << "executor: " << e.what() << "\n";
    return 2;
  } catch (const OutOfMemory& e) {
    std::cerr << oom_line(e.what(), rank, predicted_peak, watchdog.phase()) << std::endl;
  } catch (const PoolExhausted& e) {  // the device's pool at its limit (--gpu-memory-GiB)
    std::cerr << oom_line(e.what(), rank, predicted_peak, watchdog.phase()) << std::endl;
  } catch (const std::bad_alloc& e) {  // the device itself is full (cudaMalloc refused)
    std::cerr << oom_line(e.what(), rank, predicted_peak, watchdog.phase()) << std::endl;
  } catch (const std::exception& e) {
    watchdog.fail(e.what(), 1);  // "executor: rank R on H: failed in phase 'P': ..."
  }
  // Ranks allocate alike, so the others are crossing the capacity too: give them a moment to
  // print their own line before the abort ends them.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  watchdog.end_job(3);
  return 3;
}

}  // namespace

#if defined(SHARDPLAN_HAVE_MPI)
int run_under_mpi(const RunCommand& c) {
  comm::MpiEnvironment mpi;
  const int rank = mpi.world_rank();
  // No rank waits for ever: a rank that stops ends the job after --timeout-s, one that fails
  // says so (comm/watchdog.hpp).
  comm::Watchdog watchdog({.program = "executor", .rank = rank, .timeout_s = c.timeout_s},
                          [&mpi](int exit_code) { mpi.abort(exit_code); });
  double predicted_peak = 0;
  try {
    auto world = mpi.world();
    comm::WatchedCommunicator watched(*world, watchdog);  // and every group split off it
    const auto topology = comm::discover_topology(watched);
    RunSetup setup = read_setup(c, world->size());
    check_fault_rank(c, world->size());
    check_checkpoints(c, setup);
    check_out_on_rank_0(watched, c);
    predicted_peak = setup.plan.prediction.peak_bytes;
    if (c.pipeline.stages > 1) {  // executor/pipeline_run.hpp, with TP inside the stages
      PipelineFlags flags = c.pipeline;
      flags.tensor_parallel = c.request.tensor_parallel;
      flags.sequence_parallel = c.request.sequence_parallel;
      run_pipeline(flags, setup, watched, c.request.steps, c.out, capacity_bytes(c, setup.plan));
      return 0;
    }
    // With collective streams the reductions get a communicator of their own (a stream beside
    // the all-gathers', as on a GPU), and memory a stream still uses is held back at its free.
    const bool streams = c.request.collective_streams;
    if (streams && !mpi.threads_may_call())
      throw std::runtime_error(fmt::format("--collective-streams: {} does not provide "
                                           "MPI_THREAD_MULTIPLE",
                                           world->library_version()));
    // Tensor parallelism: TP groups of consecutive ranks, data parallelism over the ranks with
    // the same TP rank (tensor_parallel.hpp); the world otherwise.
    TensorParallelGroups tp_groups;
    comm::Communicator* data_world = &watched;
    if (c.request.tensor_parallel > 1) {
      tp_groups = make_tensor_parallel_groups(watched, c.request.tensor_parallel);
      setup.engine.model_options.tensor_parallel.group = tp_groups.tp.get();
      data_world = tp_groups.dp.get();
    }
    // Context parallelism: the c ranks sharing each sequence, and the d·c ranks with the same TP
    // rank the gradients are averaged over (context_parallel.hpp).
    ContextParallelGroups cp_groups;
    if (c.request.context_parallel > 1) {
      cp_groups = make_context_parallel_groups(watched, c.request.context_parallel,
                                               c.request.tensor_parallel);
      setup.engine.model_options.context_parallel.group = cp_groups.context.get();
      data_world = cp_groups.data.get();
    }
    auto owned = make_groups(*data_world, setup.plan.spec, streams);
    std::vector<std::unique_ptr<comm::StreamedCommunicator>> stream_groups;
    if (streams)
      for (auto** g : {&owned.groups.shard, &owned.groups.shard_reduce, &owned.groups.replica})
        if (*g != nullptr) {
          stream_groups.push_back(std::make_unique<comm::StreamedCommunicator>(**g));
          *g = stream_groups.back().get();
        }
    StreamOrderedHostMemory memory;
    TrackedAllocator allocator(capacity_bytes(c, setup.plan), &memory);
    RunCheckpoints checkpoints(c.checkpoint, watched, c.request.steps);
    auto m = run_steps(setup, allocator, owned.groups, rank, c.request.steps, rank == 0, watchdog,
                       c.fault, nullptr, &checkpoints);
    watchdog.set_phase("gathering the ranks' records");
    const auto records = exchange_records(watched, m.record);
    if (rank == 0) {
      watchdog.set_phase("writing the run document");
      write_run_document(
          c, setup, *m.engine, records,
          {"mpi", world->library_version(), topology.hosts, false, -1, "", 0, streams},
          &checkpoints);
    }
    return 0;
  } catch (...) {
    return finish_rank(std::current_exception(), rank, predicted_peak, watchdog);
  }
}
#else
int run_under_mpi(const RunCommand&) {
  throw InputError("--backend", "cpu runs its ranks under mpirun, and this build has no MPI; "
                                "rehearse one rank with --rehearse-rank and --world");
}
#endif

#if defined(SHARDPLAN_HAVE_NCCL)
int run_on_gpus(const RunCommand& c) {
  // Who this rank is: torchrun's environment, else MPI's (mpirun, srun), else one process alone.
  const bool torchrun = comm::launched_with_torchrun_environment();
#if defined(SHARDPLAN_HAVE_MPI)
  std::optional<comm::MpiEnvironment> mpi;
  if (!torchrun) mpi.emplace();
#endif
  comm::LaunchEnvironment env;
  if (torchrun) {
    env = comm::read_launch_environment();  // InputError naming the variable: main says it
  }
#if defined(SHARDPLAN_HAVE_MPI)
  std::unique_ptr<comm::MpiCommunicator> host_world;
  if (mpi) {
    host_world = mpi->world();
    env.rank = mpi->world_rank();
    env.world_size = mpi->world_size();
    env.local_rank = comm::discover_topology(*host_world).local_rank;
  }
#endif
  const int rank = env.rank;
  comm::Watchdog watchdog(
      {.program = "executor", .rank = rank, .timeout_s = c.timeout_s}, [&](int exit_code) {
#if defined(SHARDPLAN_HAVE_MPI)
        if (mpi) mpi->abort(exit_code);
#endif
        std::_Exit(exit_code);  // torchrun ends the other workers when one exits
      });
  double predicted_peak = 0;
  try {
    const RunSetup setup = read_setup(c, env.world_size);
    bool out_checked = false;  // by every rank, from rank 0's verdict
#if defined(SHARDPLAN_HAVE_MPI)
    if (host_world) {
      check_out_on_rank_0(*host_world, c);
      out_checked = true;
    }
#endif
    if (!out_checked && rank == 0)  // torchrun ends the other workers when this one ends
      core::check_destination(c.out, "--out");
    check_fault_rank(c, env.world_size);
    predicted_peak = setup.plan.prediction.peak_bytes;
    watchdog.set_phase("opening the GPU");
    auto device = open_device(env.local_rank,
                              capacity_GiB(c, setup.plan) ? capacity_bytes(c, setup.plan) : -1);
    watchdog.set_phase("making the NCCL communicators");
    device->before_communicators();
    std::unique_ptr<comm::NcclCommunicator> nccl;
#if defined(SHARDPLAN_HAVE_MPI)
    if (host_world) nccl = comm::NcclCommunicator::create(*host_world, env.local_rank);
#endif
    if (!nccl) nccl = comm::NcclCommunicator::create_from_environment(env, c.timeout_s);
    comm::WatchedCommunicator watched(*nccl, watchdog);
    const auto topology = comm::discover_topology(watched);
    // The reductions get a communicator of their own: a stream beside the all-gathers'.
    auto owned = make_groups(watched, setup.plan.spec, true);
    watched.barrier();
    device->after_communicators();
    TrackedAllocator allocator(capacity_bytes(c, setup.plan), &device->memory());
    auto m = run_steps(setup, allocator, owned.groups, rank, c.request.steps, rank == 0, watchdog,
                       c.fault, device.get());
    watchdog.set_phase("gathering the ranks' records");
    const auto records = exchange_records(watched, m.record);
    if (rank == 0) {
      watchdog.set_phase("writing the run document");
      write_run_document(c, setup, *m.engine, records,
                         {"nccl", watched.library_version(), topology.hosts, false, -1,
                          device->footprint().name, 0},
                         nullptr);
    }
    return 0;
  } catch (...) {
    return finish_rank(std::current_exception(), rank, predicted_peak, watchdog);
  }
}
#else
int run_on_gpus(const RunCommand&) {
  throw InputError("--backend", "cuda across ranks needs NCCL, and this build has none; "
                                "rehearse one rank with --rehearse-rank and --world");
}
#endif

int run_rehearsal(const RunCommand& c) {
  const int rank = *c.rehearse_rank, world_size = *c.world;
  // One process, no peers: a watchdog that fires ends this process.
  comm::Watchdog watchdog({.program = "executor", .rank = rank, .timeout_s = c.timeout_s},
                          [](int exit_code) { std::_Exit(exit_code); });
  double predicted_peak = 0;
  try {
    const RunSetup setup = read_setup(c, world_size);
    core::check_destination(c.out, "--out");
    if (c.fault && c.fault->rank != rank)
      throw InputError("--inject-fault",
                       fmt::format("rank {} is not the rehearsed rank {}", c.fault->rank, rank));
    predicted_peak = setup.plan.prediction.peak_bytes;
    // The CUDA backend rehearses on the GPU the process sees first (CUDA_VISIBLE_DEVICES picks).
    std::unique_ptr<DeviceRun> device;
    if (c.backend == ComputeBackend::cuda)
      device = open_device(0, capacity_GiB(c, setup.plan) ? capacity_bytes(c, setup.plan) : -1);
    MemorySource* memory = device ? &device->memory() : nullptr;
    const int S = setup.plan.spec.group(world_size);
    StandInCommunicator world(rank, world_size, memory), shard(rank % S, S, memory),
        replica(rank / S, world_size / S, memory);
    EngineGroups groups{&world, &shard, world_size > S ? &replica : nullptr, true, nullptr};
    TrackedAllocator allocator(capacity_bytes(c, setup.plan), memory);
    auto m = run_steps(setup, allocator, groups, rank, c.request.steps, true, watchdog, c.fault,
                       device.get());
    write_run_document(c, setup, *m.engine, {m.record},
                       {"rehearsal",
                        world.library_version(),
                        {comm::host_name()},
                        true,
                        rank,
                        device ? device->footprint().name : "",
                        0},
                       nullptr);
    return 0;
  } catch (const InputError& e) {
    std::cerr << "executor: " << e.what() << "\n";
    return 2;
  } catch (const OutOfMemory& e) {
    std::cerr << oom_line(e.what(), rank, predicted_peak, watchdog.phase()) << "\n";
    return 3;
  } catch (const PoolExhausted& e) {
    std::cerr << oom_line(e.what(), rank, predicted_peak, watchdog.phase()) << "\n";
    return 3;
  } catch (const std::bad_alloc& e) {
    std::cerr << oom_line(e.what(), rank, predicted_peak, watchdog.phase()) << "\n";
    return 3;
  } catch (const std::exception& e) {
    watchdog.fail(e.what(), 1);
  }
}

int run(const RunCommand& c) {
  if (c.rehearse_rank) return run_rehearsal(c);
  return c.backend == ComputeBackend::cuda ? run_on_gpus(c) : run_under_mpi(c);
}

}  // namespace shardplan::executor
