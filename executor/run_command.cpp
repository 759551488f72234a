#include "executor/run_command.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/fault_injection.hpp"
#include "comm/mpi_environment.hpp"
#include "comm/process_identity.hpp"
#include "comm/topology.hpp"
#include "comm/watchdog.hpp"
#include "comm/watched_communicator.hpp"
#include "costmodel/input_error.hpp"
#include "costmodel/json_reader.hpp"
#include "executor/checkpoint.hpp"
#include "executor/engine.hpp"
#include "executor/run_document.hpp"
#include "executor/stand_in_communicator.hpp"

namespace shardplan::executor {
namespace {

using costmodel::InputError;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::int64_t capacity_bytes(const RunCommand& c) {
  return c.capacity_GiB ? static_cast<std::int64_t>(std::llround(*c.capacity_GiB * kGiB))
                        : TrackedAllocator::kUnlimited;
}

// Writes a whole file or nothing: a temporary next to it, renamed into place.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw InputError("--out", fmt::format("cannot write \"{}\"", path));
    out << text;
    if (!out.flush())
      throw InputError("--out", fmt::format("cannot write \"{}\"", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw InputError("--out", fmt::format("cannot write \"{}\"", path));
}

std::string oom_line(const OutOfMemory& e, int rank, double predicted_peak,
                     const std::string& phase) {
  return fmt::format("executor: rank {} on {}: {} in phase '{}'; the plan predicts a peak of "
                     "{:.2f} GiB ({:.0f} bytes) per rank",
                     rank, comm::host_name(), e.what(), phase, predicted_peak / kGiB,
                     predicted_peak);
}

// A fault for a rank the run does not have would never happen: the test that asked is wrong.
void check_fault_rank(const RunCommand& c, int world_size) {
  if (c.fault && c.fault->rank >= world_size)
    throw InputError("--inject-fault", fmt::format("rank {} is not one of the run's {} ranks",
                                                   c.fault->rank, world_size));
}

struct Measured {
  std::unique_ptr<ShardingEngine> engine;
  RankRecord record;
};

Measured run_steps(const RunSetup& setup, TrackedAllocator& allocator, EngineGroups groups,
                   int rank, std::int64_t steps, bool report, comm::Watchdog& watchdog,
                   const std::optional<comm::FaultInjection>& fault,
                   RunCheckpoints* checkpoints = nullptr) {
  Measured m;
  auto options = setup.engine;
  options.watchdog = &watchdog;
  watchdog.set_phase("allocating the parameters and optimizer states");
  m.engine = std::make_unique<ShardingEngine>(options, allocator, groups);
  if (checkpoints) {
    watchdog.set_phase("resuming from the checkpoint and hashing the parameters");
    checkpoints->start(*m.engine);
  }
  for (std::int64_t k = 0; k < steps; ++k) {
    const std::int64_t step = m.engine->steps_done() + 1;
    watchdog.set_phase(fmt::format("step {}", step));
    // An injected out-of-memory takes the free capacity away: the step's first allocation fails.
    comm::inject_due_fault(fault, rank, step, watchdog,
                           [&allocator] { allocator.set_capacity(allocator.in_use_bytes()); });
    auto r = m.engine->step();
    if (report)
      std::cerr << fmt::format("executor: step {}/{}: loss {:.4f}, {:.3f} s, peak {:.1f} MiB\n",
                               r.step, steps, r.loss, r.step_s,
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
  for (auto c : kMemoryCategories)
    m.record.category_peaks[c] = allocator.peak_bytes(c);
  m.record.capacity_bytes = allocator.capacity_bytes();
  return m;
}

} // namespace

int run_under_mpi(const RunCommand& c) {
  comm::MpiEnvironment mpi;
  const int rank = mpi.world_rank();
  // No rank waits for ever: a rank that stops ends the job after --timeout-s, one that fails
  // says so (comm/watchdog.hpp).
  comm::Watchdog watchdog({.program = "executor", .rank = rank, .timeout_s = c.timeout_s},
                          [&mpi](int exit_code) { mpi.abort(exit_code); });
  double predicted_peak = 0;
  int code = 0;
  try {
    auto world = mpi.world();
    comm::WatchedCommunicator watched(*world, watchdog); // and every group split off it
    const auto topology = comm::discover_topology(watched);
    const RunSetup setup =
        make_run_setup(costmodel::read_json_file(c.plan), world->size(), c.request);
    check_fault_rank(c, world->size());
    predicted_peak = setup.plan.prediction.peak_bytes;
    auto owned = make_groups(watched, setup.plan.spec);
    TrackedAllocator allocator(capacity_bytes(c));
    RunCheckpoints checkpoints(c.checkpoint, watched);
    auto m = run_steps(setup, allocator, owned.groups, rank, c.request.steps, rank == 0, watchdog,
                       c.fault, &checkpoints);
    // Every rank's record to every rank (one all-gather of fixed-length vectors).
    watchdog.set_phase("gathering the ranks' records");
    const auto mine = pack(m.record);
    std::vector<double> all(mine.size() * static_cast<std::size_t>(world->size()));
    watched.all_gather(mine.data(), all.data(), mine.size(), comm::DataType::f64);
    if (rank == 0) {
      watchdog.set_phase("writing the run document");
      std::vector<RankRecord> records;
      for (int r = 0; r < world->size(); ++r)
        records.push_back(unpack({all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                                  all.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size())},
                                 m.record.steps.size()));
      RunEnvironment env{"mpi", world->library_version(), topology.hosts, false, -1};
      auto doc = run_document(setup, *m.engine, records, env);
      checkpoints.report(doc);
      write_file(c.out, doc.dump(2) + "\n");
      std::cerr << fmt::format(
          "executor: wrote {}: peak {:.1f} MiB (predicted {:.1f} MiB), step {:.3f} s "
          "(predicted {:.3f} s)\n",
          c.out, doc["summary"]["memory"]["peak_bytes"].get<double>() / (1 << 20),
          setup.plan.prediction.peak_bytes / (1 << 20),
          doc["summary"]["time"]["step_s"].get<double>(), setup.plan.prediction.step_s);
    }
  } catch (const InputError& e) {
    if (rank == 0)
      std::cerr << "executor: " << e.what() << "\n";
    code = 2;
  } catch (const OutOfMemory& e) {
    std::cerr << oom_line(e, rank, predicted_peak, watchdog.phase()) << std::endl;
    // Ranks allocate alike, so the others are crossing the capacity too: give them a moment to
    // print their own line before the abort ends them.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    watchdog.end_job(3);
  } catch (const std::exception& e) {
    watchdog.fail(e.what(), 1); // "executor: rank R on H: failed in phase 'P': ..."
  }
  return code;
}

int run_rehearsal(const RunCommand& c) {
  const int rank = *c.rehearse_rank, world_size = *c.world;
  // One process, no peers: a watchdog that fires ends this process.
  comm::Watchdog watchdog({.program = "executor", .rank = rank, .timeout_s = c.timeout_s},
                          [](int exit_code) { std::_Exit(exit_code); });
  double predicted_peak = 0;
  try {
    const RunSetup setup = make_run_setup(costmodel::read_json_file(c.plan), world_size, c.request);
    if (c.fault && c.fault->rank != rank)
      throw InputError("--inject-fault", fmt::format("rank {} is not the rehearsed rank {}",
                                                     c.fault->rank, rank));
    predicted_peak = setup.plan.prediction.peak_bytes;
    const int S = setup.plan.spec.group(world_size);
    StandInCommunicator world(rank, world_size), shard(rank % S, S),
        replica(rank / S, world_size / S);
    EngineGroups groups{&world, &shard, world_size > S ? &replica : nullptr, true};
    TrackedAllocator allocator(capacity_bytes(c));
    auto m = run_steps(setup, allocator, groups, rank, c.request.steps, true, watchdog, c.fault);
    RunEnvironment env{"rehearsal", world.library_version(), {comm::host_name()}, true, rank};
    const auto doc = run_document(setup, *m.engine, {m.record}, env);
    write_file(c.out, doc.dump(2) + "\n");
    std::cerr << fmt::format(
        "executor: wrote {}: rehearsal of rank {} of {}: peak {:.1f} MiB (predicted {:.1f} MiB)\n",
        c.out, rank, world_size, doc["summary"]["memory"]["peak_bytes"].get<double>() / (1 << 20),
        predicted_peak / (1 << 20));
    return 0;
  } catch (const InputError& e) {
    std::cerr << "executor: " << e.what() << "\n";
    return 2;
  } catch (const OutOfMemory& e) {
    std::cerr << oom_line(e, rank, predicted_peak, watchdog.phase()) << "\n";
    return 3;
  } catch (const std::exception& e) {
    watchdog.fail(e.what(), 1);
  }
}

} // namespace shardplan::executor
