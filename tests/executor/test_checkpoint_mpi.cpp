// Checkpoints under mpirun on 1 to 4 ranks: a checkpoint saved under ZeRO-3 on all N ranks loads
// on the first k ranks (every k from 1 to N) under DDP, ZeRO-1/2, FSDP and HSDP with exactly the
// saved parameters, each rank reading only the ranges it holds; a run interrupted by a save and a
// resume ends bit for bit where the uninterrupted run ends; a corrupted part found by any one rank
// is the same error, naming the part, on every rank.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "engine_fixture.hpp"
#include "executor/checkpoint.hpp"
#include "mpi_test_world.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;
namespace fs = std::filesystem;

namespace {

// A scratch folder every rank of the world names alike (rank 0's process id), removed after.
struct SharedScratch {
  comm::Communicator& world;
  fs::path path;
  SharedScratch(comm::Communicator& w, const char* name) : world(w) {
    std::int64_t id = ::getpid();
    world.broadcast(&id, 1, comm::DataType::i64, 0);
    path = fs::temp_directory_path() / fmt::format("shardplan-{}-{}", name, id);
    if (world.rank() == 0) {
      fs::remove_all(path);
      fs::create_directories(path);
    }
    world.barrier();
  }
  ~SharedScratch() {
    world.barrier();
    std::error_code ec;
    if (world.rank() == 0) fs::remove_all(path, ec);
  }
};

// An engine of `strategy` on the ranks of `group`.
struct Trainer {
  OwnedGroups owned;
  TrackedAllocator allocator;
  ShardingEngine engine;
  Trainer(comm::Communicator& group, const documents::ModelSpec& model, const char* strategy,
          Flavour flavour)
      : Trainer(group, test_options(model, test_spec(strategy, flavour, group.size()))) {}
  Trainer(comm::Communicator& group, const EngineOptions& o)
      : owned(make_groups(group, o.spec)), engine(o, allocator, owned.groups) {}
};

// Bytes of the unpadded elements a rank holds: what a resume must read and no more.
std::int64_t held_bytes(ShardingEngine& e) {
  std::int64_t bytes = 0;
  for (std::int64_t u = 0; u < e.layout().unit_count(); ++u) {
    const auto st = e.unit_state(u);
    const auto n = e.layout().unit_size_of(u);
    auto in_unit = [n](std::int64_t begin, std::size_t size) {
      return std::max<std::int64_t>(0, std::min(begin + static_cast<std::int64_t>(size), n) -
                                           std::min(begin, n));
    };
    bytes += 4 * (in_unit(st.params_begin, st.params.size()) +
                  in_unit(st.optimizer_begin, st.exp_avg.size()) +
                  in_unit(st.optimizer_begin, st.exp_avg_sq.size()));
  }
  return bytes;
}

}  // namespace

TEST_CASE("checkpoint::saved under zero3 on N ranks, resumed on 1 to N under any strategy") {
  auto& world = test_world();
  const int n = world.size();
  const SharedScratch dir(world, "checkpoint-reshard");
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    std::string saved;
    {
      Trainer t(world, model, "zero3", Flavour::deepspeed);
      t.engine.step();
      t.engine.step();
      save_checkpoint(t.engine, world, dir.path.string());
      saved = params_sha256(t.engine);
    }
    struct Case {
      const char* strategy;
      Flavour flavour;
    };
    const Case kResume[] = {{"ddp", Flavour::ddp},         {"zero1", Flavour::deepspeed},
                            {"zero2", Flavour::deepspeed}, {"zero3", Flavour::deepspeed},
                            {"fsdp-full", Flavour::fsdp1}, {"hsdp", Flavour::fsdp2}};
    for (int k = 1; k <= n; ++k) {
      auto first_k = world.split(world.rank() < k ? 0 : 1, world.rank());
      if (world.rank() >= k) continue;
      for (const auto& c : kResume) {
        CAPTURE(k);
        CAPTURE(c.strategy);
        Trainer t(*first_k, model, c.strategy, c.flavour);
        const auto report = load_checkpoint(t.engine, *first_k, dir.path.string());
        CHECK(report.step == 2);
        CHECK(report.bytes_read == held_bytes(t.engine));
        CHECK(params_sha256(t.engine) == saved);
        const auto r = t.engine.step();  // and it trains on from there
        CHECK(r.step == 3);
      }
    }
  }
}

TEST_CASE("checkpoint::2 steps, save, resume, 2 steps end bit for bit as 4 steps") {
  auto& world = test_world();
  const SharedScratch dir(world, "checkpoint-continue");
  const auto model = tiny_gpt2();
  for (const char* strategy : {"ddp", "zero2", "zero3", "hsdp"}) {
    CAPTURE(strategy);
    const Flavour flavour = std::string(strategy) == "ddp"    ? Flavour::ddp
                            : std::string(strategy) == "hsdp" ? Flavour::fsdp2
                                                              : Flavour::deepspeed;
    std::vector<double> losses;
    std::string uninterrupted;
    {
      Trainer t(world, model, strategy, flavour);
      for (int k = 0; k < 4; ++k) losses.push_back(t.engine.step().loss);
      uninterrupted = params_sha256(t.engine);
    }
    {
      Trainer t(world, model, strategy, flavour);
      t.engine.step();
      t.engine.step();
      save_checkpoint(t.engine, world, dir.path.string());
    }
    Trainer t(world, model, strategy, flavour);
    load_checkpoint(t.engine, world, dir.path.string());
    CHECK(t.engine.step().loss == losses[2]);
    CHECK(t.engine.step().loss == losses[3]);
    CHECK(params_sha256(t.engine) == uninterrupted);
  }
}

TEST_CASE("checkpoint::a corrupted part found by one rank is an error on every rank") {
  auto& world = test_world();
  const int n = world.size();
  const SharedScratch dir(world, "checkpoint-corrupted");
  const auto model = tiny_llama();
  {
    Trainer t(world, model, "zero2", Flavour::deepspeed);
    t.engine.step();
    save_checkpoint(t.engine, world, dir.path.string());
  }
  // The last part: its checksum is checked by the last rank.
  const auto part = dir.path / "step-00000001" / fmt::format("part-{:05}-of-{:05}.bin", n - 1, n);
  if (world.rank() == 0) {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  world.barrier();
  Trainer t(world, model, "zero3", Flavour::deepspeed);
  std::string error;
  try {
    load_checkpoint(t.engine, world, dir.path.string());
  } catch (const core::InputError& e) {
    error = e.what();
  }
  CHECK(error.find(part.string() + ": corrupted: its sha256 is") == 0);
}
