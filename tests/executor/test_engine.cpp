// The sharding engine in one process: its layout, one rank equal to the plain training loop, and
// its memory against the cost model's (a rehearsal of each rank allocates the real footprint).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "engine_fixture.hpp"
#include "executor/shard_layout.hpp"
#include "executor/synthetic_data.hpp"
#include "kernels/adamw.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

TEST_CASE("engine::shard layout pads every unit to the shard group and chunks it") {
  const auto spec = tiny_llama();
  GptLayout layout(spec);
  auto s = documents::make_spec("fsdp-full", Flavour::fsdp2, 3);
  const auto l = make_shard_layout(layout, s, 3, 2);
  REQUIRE(l.units.size() == 4);
  CHECK(l.group == 3);
  CHECK(l.shard_rank == 2);
  for (const auto& u : l.units) {
    CHECK(u.padded % 3 == 0);
    CHECK(u.padded - u.size < 3);
    CHECK(u.chunk * 3 == u.padded);
    CHECK(u.params_sharded);
  }
  CHECK(l.chunk_begin(1) == 2 * l.units[1].chunk);
  // HSDP: groups of 2 consecutive ranks; rank 3 is index 1 of group 1.
  s = documents::make_spec("hsdp", Flavour::fsdp2, 4, 2);
  const auto h = make_shard_layout(layout, s, 4, 3);
  CHECK(h.group == 2);
  CHECK(h.replicas == 2);
  CHECK(h.shard_rank == 1);
  CHECK(h.replica_rank == 1);
  // ZeRO-3's persistence threshold: units of small tensors stay whole.
  s = documents::make_spec("zero3", Flavour::deepspeed, 4);
  for (const auto& u : make_shard_layout(layout, s, 4, 0).units) CHECK_FALSE(u.params_sharded);
  s.persistence_threshold = 0;
  for (const auto& u : make_shard_layout(layout, s, 4, 0).units) CHECK(u.params_sharded);
  CHECK_THROWS_AS(
      make_shard_layout(layout, documents::make_spec("hsdp", Flavour::fsdp2, 4, 3), 4, 0),
      std::invalid_argument);
}

TEST_CASE("engine::one rank of DDP is the plain training loop, bit for bit") {
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    const auto options = test_options(model, test_spec("ddp", Flavour::ddp, 1), 1);
    StandInCommunicator self(0, 1);
    const auto engine_run = run_engine(options, {&self, &self, nullptr, false}, 3);

    TrackedAllocator allocator;
    WholeModel<float> m(model, allocator, options.seed);
    std::vector<Buffer> exp_avg, exp_avg_sq;
    for (const auto& p : m.params) {
      exp_avg.push_back(allocator.allocate<float>(MemoryCategory::optimizer_states, p.size()));
      exp_avg_sq.push_back(allocator.allocate<float>(MemoryCategory::optimizer_states, p.size()));
    }
    for (std::int64_t step = 1; step <= 3; ++step) {
      m.zero_grads();
      auto batch =
          synthetic_sequences(allocator, options.seed, (step - 1) * options.micro_batch.batch,
                              options.micro_batch, model.vocab);
      const double loss = m.run(batch.inputs.span(), batch.targets.span(), options.micro_batch,
                                Checkpointing::none, true);
      CHECK(loss == engine_run.losses[static_cast<std::size_t>(step - 1)]);
      for (std::size_t u = 0; u < m.params.size(); ++u)
        adamw_step<float>(m.params[u].span(), m.grads[u].span(), exp_avg[u].span(),
                          exp_avg_sq[u].span(), step, options.adamw);
    }
    for (std::size_t u = 0; u < m.params.size(); ++u) {
      REQUIRE(engine_run.params[u].size() == static_cast<std::size_t>(m.params[u].size()));
      CHECK(std::memcmp(engine_run.params[u].data(), m.params[u].data(),
                        engine_run.params[u].size() * 4) == 0);
    }
  }
}

TEST_CASE("engine::model states are the cost model's to the byte") {
  // Under every precision the executor runs: state_bytes (costmodel/accounting.cpp) says fp32
  // keeps 4 + 4 + 4 bytes per parameter; bf16-/fp16-mixed under PyTorch's flavours fp32
  // parameters (the master) and moments, under DeepSpeed a 2-byte partition beside an fp32
  // master and moments. The engine allocates exactly those.
  const auto model = small_llama();
  for (auto precision : {documents::Precision::fp32, documents::Precision::bf16_mixed,
                         documents::Precision::fp16_mixed})
    for (int world : {1, 2, 4}) {
      const auto hw = cpu_profile(world);
      for (const auto& s : kStrategies) {
        if (std::string(s.name) == "hsdp" && world == 1) continue;
        CAPTURE(world);
        CAPTURE(std::string(s.name));
        CAPTURE(std::string(documents::flavour_name(s.flavour)));
        CAPTURE(std::string(documents::precision_name(precision)));
        auto options = test_options(model, test_spec(s.name, s.flavour, world, 1 << 16));
        options.precision = precision;
        const auto predicted = predict(options, world, hw);
        REQUIRE(predicted.valid);
        for (int rank = 0; rank < world; ++rank) {
          const auto run = rehearse_engine(options, rank, world, 1);
          CHECK(static_cast<double>(run.at_peak[MemoryCategory::parameters]) ==
                predicted.model_states[static_cast<int>(documents::Category::parameters)]);
          CHECK(static_cast<double>(run.at_peak[MemoryCategory::optimizer_states]) ==
                predicted.model_states[static_cast<int>(documents::Category::optimizer_states)]);
        }
      }
    }
}

TEST_CASE("engine::peak memory is the cost model's") {
  // The walk counts the executor's own tensors and buffers (costmodel/block_table.cpp,
  // executor_rows; accounting.cpp, its head; simulation.hpp, executor_casts for DDP's 16-bit
  // copies): every
  // plan's peak and what is alive at it, category by category, within 0.01%. The worst is printed.
  const auto model = small_llama();
  for (const auto precision : {documents::Precision::fp32, documents::Precision::bf16_mixed}) {
    double worst = 0;
    for (int world : {1, 2, 4}) {
      const auto hw = cpu_profile(world);
      for (auto ckpt : {Checkpointing::none, Checkpointing::full})
        for (const auto& s : kStrategies) {
          if (std::string(s.name) == "hsdp" && world == 1) continue;
          auto options = test_options(model, test_spec(s.name, s.flavour, world, 1 << 16), 2, ckpt);
          options.precision = precision;
          const auto predicted = predict(options, world, hw);
          const auto run = rehearse_engine(options, 0, world, 2);
          const double error = (predicted.peak_bytes - static_cast<double>(run.peak_bytes)) /
                               static_cast<double>(run.peak_bytes);
          worst = std::max(worst, std::abs(error));
          INFO(std::string(documents::precision_name(precision))
               << ", " << world << " ranks, " << std::string(s.name) << " ("
               << std::string(documents::flavour_name(s.flavour)) << "), ckpt "
               << (ckpt == Checkpointing::full ? "full" : "none") << ": predicted "
               << predicted.peak_bytes << ", measured " << run.peak_bytes << ", error "
               << 100 * error << "% at " << predicted.peak_when);
          CHECK(std::abs(error) < 1e-4);
          const std::pair<MemoryCategory, documents::Category> categories[] = {
              {MemoryCategory::parameters, documents::Category::parameters},
              {MemoryCategory::gradients, documents::Category::gradients},
              {MemoryCategory::optimizer_states, documents::Category::optimizer_states},
              {MemoryCategory::activations, documents::Category::activations},
              {MemoryCategory::buffers, documents::Category::buffers}};
          for (const auto& [measured, walked] : categories)
            CHECK(std::abs(static_cast<double>(run.at_peak[measured]) -
                           predicted.at_peak[static_cast<int>(walked)]) <=
                  1e-4 * static_cast<double>(run.peak_bytes));
        }
    }
    MESSAGE(std::string(documents::precision_name(precision))
            << ": worst peak error " << 100 * worst << "%");
  }
}
