// The sharding engine in one process: its layout, one rank equal to the plain training loop, and
// its memory against the cost model's (a rehearsal of each rank allocates the real footprint).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "costmodel/simulator.hpp"
#include "engine_fixture.hpp"
#include "executor/adamw.hpp"
#include "executor/shard_layout.hpp"
#include "executor/synthetic_data.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::executor::testing;
using costmodel::Flavour;

namespace {

// A CPU device for the cost model: nothing but what the memory walk and the compute model need.
costmodel::HardwareProfile cpu_profile(int ranks) {
  costmodel::HardwareProfile h;
  h.name = "test-cpu";
  h.memory_bytes = 1e12;
  h.peak_flops[costmodel::DType::fp32] = 1e11;
  h.hbm_bandwidth_Bps = 1e10;
  h.compute_efficiency = 1;
  h.is_cpu = true;
  h.gpus_per_node = ranks;
  h.intra_bandwidth_Bps = h.inter_bandwidth_Bps = 1e10;
  h.intra_latency_s = h.inter_latency_s = 1e-6;
  h.host_memory_bytes = 1e12;
  h.host_link_Bps = 1e10;
  h.host_optimizer_params_per_s = 1e9;
  return h;
}

costmodel::StepResult predict(const EngineOptions& o, int world,
                              const costmodel::HardwareProfile& hw) {
  costmodel::StepInput in;
  in.model = &o.model;
  in.hardware = &hw;
  in.cluster = {world, world};
  in.job.seq_len = o.micro_batch.seq;
  in.job.micro_batch = o.micro_batch.batch;
  in.job.global_batch = o.micro_batch.batch * o.grad_accumulation * world;
  in.job.precision = costmodel::Precision::fp32;
  in.job.optimizer = costmodel::Optimizer::adamw;
  in.job.attention = costmodel::AttentionImpl::eager;
  in.job.checkpointing = o.checkpointing == Checkpointing::full ? costmodel::Checkpointing::full
                                                                : costmodel::Checkpointing::none;
  in.spec = o.spec;
  return costmodel::simulate_step(in);
}

struct Strategy {
  const char* name;
  Flavour flavour;
};
const Strategy kStrategies[] = {{"ddp", Flavour::ddp},
                                {"zero1", Flavour::deepspeed},
                                {"zero2", Flavour::deepspeed},
                                {"zero3", Flavour::deepspeed},
                                {"fsdp-full", Flavour::fsdp2},
                                {"fsdp-full", Flavour::fsdp1},
                                {"fsdp-grad-op", Flavour::fsdp2},
                                {"hsdp", Flavour::fsdp2}};

// A small model whose head dominates the peak, as a real vocabulary makes it, with every unit a
// multiple of 4 elements (so shards of 1, 2 and 4 ranks need no padding).
costmodel::ModelSpec small_llama() {
  return scale_down(
      costmodel::load_model("llama-3-8b"),
      {.layers = 3, .hidden = 32, .heads = 4, .kv_heads = 2, .intermediate = 64, .vocab = 512});
}

} // namespace

TEST_CASE("engine::shard layout pads every unit to the shard group and chunks it") {
  const auto spec = tiny_llama();
  GptLayout layout(spec);
  auto s = costmodel::make_spec("fsdp-full", Flavour::fsdp2, 3);
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
  s = costmodel::make_spec("hsdp", Flavour::fsdp2, 4, 2);
  const auto h = make_shard_layout(layout, s, 4, 3);
  CHECK(h.group == 2);
  CHECK(h.replicas == 2);
  CHECK(h.shard_rank == 1);
  CHECK(h.replica_rank == 1);
  // ZeRO-3's persistence threshold: units of small tensors stay whole.
  s = costmodel::make_spec("zero3", Flavour::deepspeed, 4);
  for (const auto& u : make_shard_layout(layout, s, 4, 0).units)
    CHECK_FALSE(u.params_sharded);
  s.persistence_threshold = 0;
  for (const auto& u : make_shard_layout(layout, s, 4, 0).units)
    CHECK(u.params_sharded);
  CHECK_THROWS_AS(
      make_shard_layout(layout, costmodel::make_spec("hsdp", Flavour::fsdp2, 4, 3), 4, 0),
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
  const auto model = small_llama();
  for (int world : {1, 2, 4}) {
    const auto hw = cpu_profile(world);
    for (const auto& s : kStrategies) {
      if (std::string(s.name) == "hsdp" && world == 1)
        continue;
      CAPTURE(world);
      CAPTURE(s.name);
      CAPTURE(costmodel::flavour_name(s.flavour));
      const auto options = test_options(model, test_spec(s.name, s.flavour, world, 1 << 16));
      const auto predicted = predict(options, world, hw);
      REQUIRE(predicted.valid);
      for (int rank = 0; rank < world; ++rank) {
        const auto run = rehearse_engine(options, rank, world, 1);
        CHECK(static_cast<double>(run.at_peak[MemoryCategory::parameters]) ==
              predicted.model_states[static_cast<int>(costmodel::Category::parameters)]);
        CHECK(static_cast<double>(run.at_peak[MemoryCategory::optimizer_states]) ==
              predicted.model_states[static_cast<int>(costmodel::Category::optimizer_states)]);
      }
    }
  }
}

TEST_CASE("engine::peak memory is the cost model's") {
  const auto model = small_llama();
  for (int world : {1, 2, 4}) {
    const auto hw = cpu_profile(world);
    for (auto ckpt : {Checkpointing::none, Checkpointing::full})
      for (const auto& s : kStrategies) {
        if (std::string(s.name) == "hsdp" && world == 1)
          continue;
        const auto options =
            test_options(model, test_spec(s.name, s.flavour, world, 1 << 16), 2, ckpt);
        const auto predicted = predict(options, world, hw);
        const auto run = rehearse_engine(options, 0, world, 2);
        const double error = (predicted.peak_bytes - static_cast<double>(run.peak_bytes)) /
                             static_cast<double>(run.peak_bytes);
        INFO(world << " ranks, " << std::string(s.name) << " ("
                   << std::string(costmodel::flavour_name(s.flavour)) << "), ckpt "
                   << (ckpt == Checkpointing::full ? "full" : "none") << ": predicted "
                   << predicted.peak_bytes << ", measured " << run.peak_bytes << ", error "
                   << 100 * error << "% at " << predicted.peak_when);
        CHECK(std::abs(error) < 0.03);
      }
  }
}
