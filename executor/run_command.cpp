#include "executor/run_command.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/mpi_environment.hpp"
#include "comm/process_identity.hpp"
#include "comm/topology.hpp"
#include "costmodel/input_error.hpp"
#include "costmodel/json_reader.hpp"
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

std::string oom_line(const OutOfMemory& e, int rank, double predicted_peak) {
  return fmt::format(
      "executor: rank {} on {}: {}; the plan predicts a peak of {:.2f} GiB ({:.0f} bytes) per rank",
      rank, comm::host_name(), e.what(), predicted_peak / kGiB, predicted_peak);
}

struct Measured {
  std::unique_ptr<ShardingEngine> engine;
  RankRecord record;
};

Measured run_steps(const RunSetup& setup, TrackedAllocator& allocator, EngineGroups groups,
                   int rank, std::int64_t steps, bool report) {
  Measured m;
  m.engine = std::make_unique<ShardingEngine>(setup.engine, allocator, groups);
  for (std::int64_t k = 0; k < steps; ++k) {
    auto r = m.engine->step();
    if (report)
      std::cerr << fmt::format("executor: step {}/{}: loss {:.4f}, {:.3f} s, peak {:.1f} MiB\n",
                               r.step, steps, r.loss, r.step_s,
                               static_cast<double>(allocator.peak_bytes()) / (1 << 20));
    m.record.steps.push_back(r);
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
  double predicted_peak = 0;
  int code = 0;
  try {
    auto world = mpi.world();
    const auto topology = comm::discover_topology(*world);
    const RunSetup setup =
        make_run_setup(costmodel::read_json_file(c.plan), world->size(), c.request);
    predicted_peak = setup.plan.prediction.peak_bytes;
    auto owned = make_groups(*world, setup.plan.spec);
    TrackedAllocator allocator(capacity_bytes(c));
    auto m = run_steps(setup, allocator, owned.groups, rank, c.request.steps, rank == 0);
    // Every rank's record to every rank (one all-gather of fixed-length vectors).
    const auto mine = pack(m.record);
    std::vector<double> all(mine.size() * static_cast<std::size_t>(world->size()));
    world->all_gather(mine.data(), all.data(), mine.size(), comm::DataType::f64);
    if (rank == 0) {
      std::vector<RankRecord> records;
      for (int r = 0; r < world->size(); ++r)
        records.push_back(unpack({all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                                  all.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size())},
                                 m.record.steps.size()));
      RunEnvironment env{"mpi", world->library_version(), topology.hosts, false, -1};
      const auto doc = run_document(setup, *m.engine, records, env);
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
    std::cerr << oom_line(e, rank, predicted_peak) << std::endl;
    // Ranks allocate alike, so the others are crossing the capacity too: give them a moment to
    // print their own line before the abort ends them.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    mpi.abort(3);
  } catch (const std::exception& e) {
    std::cerr << fmt::format("executor: rank {} on {}: error: {}", rank, comm::host_name(),
                             e.what())
              << std::endl;
    mpi.abort(1);
  }
  return code;
}

int run_rehearsal(const RunCommand& c) {
  const int rank = *c.rehearse_rank, world_size = *c.world;
  double predicted_peak = 0;
  try {
    const RunSetup setup = make_run_setup(costmodel::read_json_file(c.plan), world_size, c.request);
    predicted_peak = setup.plan.prediction.peak_bytes;
    const int S = setup.plan.spec.group(world_size);
    StandInCommunicator world(rank, world_size), shard(rank % S, S),
        replica(rank / S, world_size / S);
    EngineGroups groups{&world, &shard, world_size > S ? &replica : nullptr, true};
    TrackedAllocator allocator(capacity_bytes(c));
    auto m = run_steps(setup, allocator, groups, rank, c.request.steps, true);
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
    std::cerr << oom_line(e, rank, predicted_peak) << "\n";
    return 3;
  }
}

} // namespace shardplan::executor
