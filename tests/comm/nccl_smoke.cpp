// The NCCL backend on this machine's GPUs, under mpirun or torchrun (one rank per GPU), or one
// process alone (--alone, and always without MPI): every collective on device buffers, checked
// against the reference sums, then a split. Exits 77 (a skipped test) when
// there is no CUDA device, saying so; 0 when every check passes; 1 otherwise.
#include <cstdio>
#include <exception>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/launch_env.hpp"
#if SHARDPLAN_HAVE_MPI
#include "comm/mpi_environment.hpp"
#endif
#include "comm/nccl_communicator.hpp"
#include "comm/topology.hpp"

using namespace shardplan::comm;

namespace {

constexpr int kSkipped = 77;

float value(int rank, std::size_t i) {
  return static_cast<float>((static_cast<std::size_t>(rank) + i) % 7 + 1);
}

int check(Communicator& c, const char* what, const std::vector<float>& got, auto expected) {
  int wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected(i)) ++wrong;
  if (wrong) fmt::print(stderr, "rank {}: {}: {} wrong of {}\n", c.rank(), what, wrong, got.size());
  return wrong;
}

int run_collectives(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const std::size_t count = 1001;  // odd, and not divisible by the rank count
  const std::size_t total = count * static_cast<std::size_t>(n);
  std::vector<float> host(total);
  for (std::size_t i = 0; i < total; ++i) host[i] = value(me, i);
  auto send = c.allocate(total * sizeof(float));
  auto recv = c.allocate(total * sizeof(float));
  send->copy_from_host(host.data(), total * sizeof(float));
  auto sum = [&](std::size_t i) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, i);
    return s;
  };
  std::vector<float> out(count);
  int wrong = 0;
  c.all_reduce(send->data(), recv->data(), count, DataType::f32);
  c.synchronize();
  recv->copy_to_host(out.data(), count * sizeof(float));
  wrong += check(c, "all_reduce", out, sum);
  c.reduce_scatter(send->data(), recv->data(), count, DataType::f32);
  c.synchronize();
  recv->copy_to_host(out.data(), count * sizeof(float));
  wrong += check(c, "reduce_scatter", out,
                 [&](std::size_t i) { return sum(static_cast<std::size_t>(me) * count + i); });
  std::vector<float> gathered(total);
  c.all_gather(send->data(), recv->data(), count, DataType::f32);
  c.synchronize();
  recv->copy_to_host(gathered.data(), total * sizeof(float));
  wrong += check(c, "all_gather", gathered,
                 [&](std::size_t i) { return value(static_cast<int>(i / count), i % count); });
  c.all_to_all(send->data(), recv->data(), count, DataType::f32);
  c.synchronize();
  recv->copy_to_host(gathered.data(), total * sizeof(float));
  wrong += check(c, "all_to_all", gathered, [&](std::size_t i) {
    return value(static_cast<int>(i / count), static_cast<std::size_t>(me) * count + i % count);
  });
  c.broadcast(send->data(), count, DataType::f32, 0);
  c.synchronize();
  send->copy_to_host(out.data(), count * sizeof(float));
  wrong += check(c, "broadcast", out, [&](std::size_t i) { return value(0, i); });
  c.barrier();
  return wrong;
}

// The sum of `wrong` over the communicator's ranks, through the communicator itself.
int wrong_anywhere(Communicator& c, int wrong) {
  auto buffer = c.allocate(sizeof(int));
  buffer->copy_from_host(&wrong, sizeof(int));
  c.all_reduce(buffer->data(), buffer->data(), 1, DataType::i32);
  c.synchronize();
  int sum = 0;
  buffer->copy_to_host(&sum, sizeof(int));
  return sum;
}

int check_all(NcclCommunicator& nccl, const char* how) {
  int wrong = run_collectives(nccl);
  auto halves = nccl.split(nccl.rank() % 2, nccl.rank());
  wrong += run_collectives(*halves);
  wrong = wrong_anywhere(nccl, wrong);
  if (nccl.rank() == 0)
    fmt::print("NCCL backend ({}) on {} ranks ({}): {}\n", nccl.library_version(), nccl.size(), how,
               wrong == 0 ? "every collective correct" : "WRONG RESULTS");
  return wrong == 0 ? 0 : 1;
}

#if SHARDPLAN_HAVE_MPI
// Ranks started by mpirun: NCCL's id shared over MPI.
int run_under_mpi(bool probe) {
  MpiEnvironment mpi;
  auto world = mpi.world();
  const int devices = cuda_device_count();
  int fewest = devices;
  world->all_reduce(&devices, &fewest, 1, DataType::i32, ReduceOp::min);
  if (fewest == 0) {
    if (world->rank() == 0)
      fmt::print("skipped: no CUDA device on this machine (the NCCL backend needs one per rank)\n");
    return kSkipped;
  }
  if (probe) return 0;
  try {
    const Topology topology = discover_topology(*world);
    auto nccl = NcclCommunicator::create(*world, topology.local_rank);
    return check_all(*nccl, "mpirun");
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    mpi.abort(1);
  }
}
#endif

// One process alone (--alone, and always without MPI), or the ranks torchrun started.
int run_without_mpi(bool probe) {
  if (cuda_device_count() == 0) {
    fmt::print("skipped: no CUDA device on this machine (the NCCL backend needs one per rank)\n");
    return kSkipped;
  }
  if (probe) return 0;
  try {
    if (launched_with_torchrun_environment())
      return check_all(*NcclCommunicator::create_from_environment(read_launch_environment()),
                       "torchrun");
    return check_all(*NcclCommunicator::create_alone(0), "one process, no MPI");
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool alone = false, probe = false;
  for (int i = 1; i < argc; ++i) {
    alone = alone || std::string_view(argv[i]) == "--alone";
    probe = probe || std::string_view(argv[i]) == "--probe";
  }
#if SHARDPLAN_HAVE_MPI
  if (!alone && !launched_with_torchrun_environment()) return run_under_mpi(probe);
#endif
  return run_without_mpi(probe);
}
