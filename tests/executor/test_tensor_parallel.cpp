// Tensor parallelism's slicing and checks (executor/tensor_parallel.hpp), without MPI: each rank's
// local unit is Megatron's slice of the full unit, the slices put back together are the full unit,
// and what cannot be split is refused naming the flag.
#include <doctest/doctest.h>

#include <numeric>

#include "core/input_error.hpp"
#include "costmodel/plan.hpp"
#include "executor/run_setup.hpp"
#include "executor/stand_in_communicator.hpp"
#include "executor/tensor_parallel.hpp"
#include "model_fixture.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;

namespace {

std::int64_t block_size(const documents::ModelSpec& m) {
  return GptLayout(m).unit_size(UnitKind::block);
}

}  // namespace

TEST_CASE("tensor_parallel::local units hold 1/t of every matrix and whole replicated vectors") {
  // Llama (no biases): only the two RMSNorm weights [h] are replicated, so a local block holds
  // (P − 2h)/t + 2h elements. GPT-2: the two LayerNorms (4h) and the two row-parallel biases
  // (attn.c_proj, mlp.c_proj: 2h) are whole; q/k/v and c_fc biases are split with their rows.
  const auto llama = tiny_llama(), gpt2 = tiny_gpt2();
  const std::int64_t h = 16;
  CHECK(block_size(local_spec(llama, 2)) == (block_size(llama) - 2 * h) / 2 + 2 * h);
  for (int t : {2, 4})
    CHECK(block_size(local_spec(gpt2, t)) == (block_size(gpt2) - 6 * h) / t + 6 * h);
  // Embedding and head are replicated.
  const GptLayout full(gpt2), local(local_spec(gpt2, 4));
  CHECK(local.unit_size(UnitKind::embedding) == full.unit_size(UnitKind::embedding));
  CHECK(local.unit_size(UnitKind::head) == full.unit_size(UnitKind::head));
}

TEST_CASE("tensor_parallel::rank r holds Megatron's r-th slice and the slices rebuild the unit") {
  for (const auto& model : {tiny_llama(), tiny_gpt2(), tiny_neox()}) {
    CAPTURE(model.name);
    const GptLayout full(model);
    const std::int64_t n = full.unit_size(UnitKind::block);
    std::vector<float> values(static_cast<std::size_t>(n));
    std::iota(values.begin(), values.end(), 0.0f);  // element i holds i: slices show their origin
    const int t = 2;
    const GptLayout local(local_spec(model, t));
    const std::int64_t ln = local.unit_size(UnitKind::block);
    std::vector<float> gathered(static_cast<std::size_t>(ln * t));
    for (int r = 0; r < t; ++r)
      slice_unit<float>(values,
                        std::span(gathered).subspan(static_cast<std::size_t>(r * ln),
                                                    static_cast<std::size_t>(ln)),
                        slice_segments(full, local, UnitKind::block, t, r));
    // Rank 1's q weight starts at full row q_width/2 (its first head); its first output row of
    // the output projection starts at column q_width/2 of the full row 0.
    const auto& F = full.block();
    const auto& L = local.block();
    const std::int64_t qw = model.q_width(), h = model.hidden;
    CHECK(gathered[static_cast<std::size_t>(ln + L.q.weight)] == float(F.q.weight + qw / 2 * h));
    CHECK(gathered[static_cast<std::size_t>(ln + L.o.weight)] == float(F.o.weight + qw / 2));
    CHECK(gathered[static_cast<std::size_t>(ln + L.down.weight + 1)] ==
          float(F.down.weight + model.intermediate / 2 + 1));
    CHECK(assemble_unit(full, local, 1, gathered, t) == values);
  }
}

TEST_CASE("tensor_parallel::what t does not divide is refused") {
  const auto llama = tiny_llama();  // 4 heads, 2 key/value heads, 24 intermediate
  CHECK_THROWS_WITH_AS(check_tensor_parallel(llama, 3),
                       "tensor-parallel size 3 does not divide the 4 attention heads",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_tensor_parallel(llama, 4),
                       "tensor-parallel size 4 does not divide the 2 key/value heads",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_tensor_parallel(llama, 0), "tensor-parallel size 0 is not >= 1",
                       std::invalid_argument);
  StandInCommunicator world(0, 3);
  CHECK_THROWS_WITH_AS(make_tensor_parallel_groups(world, 2),
                       "tensor-parallel size 2 does not divide the 3 ranks", std::invalid_argument);
}

TEST_CASE("tensor_parallel::a run's --tensor-parallel is checked against the plan") {
  costmodel::Plan p;
  p.model = tiny_llama();
  p.hardware = "test-cpu";
  p.cluster = {4, 4};
  p.job.seq_len = 8;
  p.job.global_batch = 16;
  p.job.micro_batch = 2;
  p.job.precision = documents::Precision::fp32;
  p.job.attention = documents::AttentionImpl::eager;
  p.job.recipe = documents::Recipe::executor;
  p.spec = documents::make_spec("ddp", std::nullopt, 4);
  const auto plan = costmodel::plan_to_json(p);
  RunRequest request;
  request.tensor_parallel = 2;
  request.sequence_parallel = true;
  const auto setup = make_run_setup(plan, 4, request);
  // 2 replicas of micro-batch 2 make the global batch of 16 in 4 micro-batches.
  CHECK(setup.engine.grad_accumulation == 4);
  CHECK(setup.engine.model.heads == 2);
  CHECK(setup.engine.model.kv_heads == 1);
  CHECK(setup.engine.model_options.tensor_parallel.sequence_parallel);
  auto where = [&](const nlohmann::json& document, int t, int world) {
    request.tensor_parallel = t;
    try {
      (void)make_run_setup(document, world, request);
    } catch (const core::InputError& e) {
      return e.where() + " " + e.what();
    }
    return std::string("accepted");
  };
  CHECK(where(plan, 4, 4) == "--tensor-parallel --tensor-parallel: tensor-parallel size 4 does "
                             "not divide the 2 key/value heads");
  p.cluster = {3, 3};
  p.job.global_batch = 12;
  p.spec = documents::make_spec("ddp", std::nullopt, 3);
  CHECK(where(costmodel::plan_to_json(p), 2, 3) ==
        "--tensor-parallel --tensor-parallel: 2 does not divide the 3 ranks");
}
