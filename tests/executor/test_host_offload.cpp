// Optimizer and parameter offload on the CPU backend (executor/host_offload.hpp): the same
// training as without offload, and the device memory the cost model's offload predicts.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "engine_fixture.hpp"
#include "executor/host_offload.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;
using documents::Offload;

namespace {

struct OffloadCase {
  const char* strategy;
  Flavour flavour;
  Offload offload;
};
// What the cost model lets offload (costmodel/simulator.cpp check_plan): DeepSpeed's optimizer
// offload under ZeRO-1/2/3, parameter offload under ZeRO-3, FSDP's CPUOffload (parameters).
constexpr OffloadCase kCases[] = {{"zero1", Flavour::deepspeed, Offload::optimizer},
                                  {"zero2", Flavour::deepspeed, Offload::optimizer},
                                  {"zero3", Flavour::deepspeed, Offload::optimizer},
                                  {"zero3", Flavour::deepspeed, Offload::params},
                                  {"fsdp-full", Flavour::fsdp2, Offload::params},
                                  {"fsdp-full", Flavour::fsdp1, Offload::params}};

EngineOptions offload_options(const OffloadCase& c, int world, Offload offload,
                              std::int64_t grad_accumulation,
                              documents::Precision precision = documents::Precision::fp32) {
  auto spec = test_spec(c.strategy, c.flavour, world, 1 << 16);
  spec.offload = offload;
  if (precision != documents::Precision::fp32)  // the compute type: what the engine reduces in
    spec.reduce_dtype = documents::compute_dtype(precision);
  auto options = test_options(small_llama(), spec, grad_accumulation);
  options.precision = precision;
  return options;
}

std::string name_of(const OffloadCase& c) {
  return std::string(c.strategy) + " (" + documents::flavour_name(c.flavour) + "), offload " +
         documents::offload_name(c.offload);
}

}  // namespace

TEST_CASE("host_offload::offloaded training is the training without offload") {
  // One rank, 3 steps. One micro-batch: bit for bit (the same AdamW on the same fp32 values; the
  // reduced chunk is added into a zeroed host chunk, 0 + x = x). Two micro-batches: the host adds
  // the two reduced chunks where the device path reduces their sum, one fp32 rounding per add:
  // relative L2 of the parameters within 1e-6 (a few units of 2⁻²⁴ after 3 AdamW steps).
  for (const auto& c : kCases)
    for (std::int64_t gas : {1, 2}) {
      CAPTURE(name_of(c));
      CAPTURE(gas);
      StandInCommunicator w(0, 1), shard(0, 1);
      const EngineGroups groups{&w, &shard, nullptr, true};
      const auto plain = run_engine(offload_options(c, 1, Offload::none, gas), groups, 3);
      const auto off = run_engine(offload_options(c, 1, c.offload, gas), groups, 3);
      REQUIRE(plain.losses.size() == off.losses.size());
      const double error = relative_l2(off.params, plain.params);
      if (gas == 1) {
        for (std::size_t k = 0; k < plain.losses.size(); ++k)
          CHECK(off.losses[k] == plain.losses[k]);
        CHECK(error == 0);
      } else {
        CHECK(error < 1e-6);
      }
    }
}

TEST_CASE("host_offload::the device holds what the cost model's offload counts") {
  // Every rank of 1, 2 and 4: no optimizer states on the device; the parameters the cost model
  // keeps there (all of them under optimizer offload, only the unpartitioned under parameter
  // offload), to the byte; the device peak within 0.01% as engine::peak memory is the cost
  // model's.
  double worst = 0;
  for (int world : {1, 2, 4})
    for (const auto& c : kCases) {
      const auto options = offload_options(c, world, c.offload, 2);
      const auto predicted = predict(options, world, cpu_profile(world));
      REQUIRE(predicted.valid);
      const auto plain = rehearse_engine(offload_options(c, world, Offload::none, 2), 0, world, 2);
      for (int rank = 0; rank < world; ++rank) {
        const auto run = rehearse_engine(options, rank, world, 2);
        const double error = (predicted.peak_bytes - static_cast<double>(run.peak_bytes)) /
                             static_cast<double>(run.peak_bytes);
        worst = std::max(worst, std::abs(error));
        INFO(name_of(c) << ", rank " << rank << " of " << world << ": predicted "
                        << predicted.peak_bytes << " B, measured " << run.peak_bytes << " B, error "
                        << 100 * error << "%");
        CHECK(std::abs(error) < 1e-4);
        CHECK(run.category_peaks[MemoryCategory::optimizer_states] == 0);
        CHECK(static_cast<double>(run.at_peak[MemoryCategory::parameters]) ==
              predicted.model_states[static_cast<int>(documents::Category::parameters)]);
        if (rank == 0) CHECK(run.peak_bytes < plain.peak_bytes);
      }
    }
  MESSAGE("offload: worst device peak error " << 100 * worst << "%");
}

TEST_CASE("host_offload::what no framework offloads is refused") {
  auto spec = documents::make_spec("ddp", Flavour::ddp, 2, std::nullopt);
  spec.offload = Offload::optimizer;
  CHECK_THROWS_WITH_AS(offload_policy(spec),
                       "offload optimizer needs sharded optimizer states (ZeRO or FSDP), ddp "
                       "keeps them whole",
                       std::invalid_argument);
  spec = documents::make_spec("zero2", Flavour::deepspeed, 2, std::nullopt);
  spec.offload = Offload::params;
  CHECK_THROWS_WITH_AS(offload_policy(spec),
                       "offload params needs partitioned parameters (zero3, fsdp-full, hsdp), "
                       "zero2 keeps them whole",
                       std::invalid_argument);
  spec.offload = Offload::optimizer;
  CHECK(offload_policy(spec).optimizer);
  CHECK_FALSE(offload_policy(spec).params);
  spec = documents::make_spec("fsdp-full", Flavour::fsdp2, 2, std::nullopt);
  spec.offload = Offload::optimizer;
  CHECK_THROWS_WITH_AS(offload_policy(spec),
                       "FSDP offloads parameters, gradients and optimizer together (CPUOffload); "
                       "use offload params",
                       std::invalid_argument);
}

TEST_CASE("host_offload::mixed precision offloads the fp32 master and moments") {
  // bf16-mixed on 2 ranks: no optimizer state on the device, the parameters the cost model keeps
  // there to the byte, and the peak (in the head's backward) the cost model's, within 0.01% (as
  // engine::peak memory is the cost model's: the walk counts the executor's own tensors).
  for (const auto& c : kCases) {
    CAPTURE(name_of(c));
    const auto options = offload_options(c, 2, c.offload, 2, documents::Precision::bf16_mixed);
    const auto predicted = predict(options, 2, cpu_profile(2));
    REQUIRE(predicted.valid);
    const auto run = rehearse_engine(options, 1, 2, 2);
    const auto measured = static_cast<double>(run.peak_bytes);
    INFO("predicted " << predicted.peak_bytes << " B, measured " << measured << " B");
    CHECK(std::abs(predicted.peak_bytes - measured) / measured < 1e-4);
    CHECK(run.category_peaks[MemoryCategory::optimizer_states] == 0);
    CHECK(static_cast<double>(run.at_peak[MemoryCategory::parameters]) ==
          predicted.model_states[static_cast<int>(documents::Category::parameters)]);
  }
}
