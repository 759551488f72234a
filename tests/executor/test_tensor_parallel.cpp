// Tensor parallelism's slicing and checks (executor/tensor_parallel.hpp), without MPI: each rank's
// local unit is Megatron's slice of the full unit, the slices put back together are the full unit,
// and what cannot be split is refused naming the flag.
#include <doctest/doctest.h>

#include <numeric>

#include "core/input_error.hpp"
#include "documents/plan.hpp"
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
  // t = 4 with a vocabulary of 48 (a multiple of 4: the embedding and head are split by t too).
  const auto gpt2_48 = scale_down(documents::load_model("gpt2"), {.layers = 2,
                                                                  .hidden = 16,
                                                                  .heads = 4,
                                                                  .intermediate = 32,
                                                                  .vocab = 48,
                                                                  .max_positions = 12});
  for (int t : {2, 4})
    CHECK(block_size(local_spec(gpt2_48, t)) == (block_size(gpt2_48) - 6 * h) / t + 6 * h);
  // Vocabulary-parallel: the token table [V, h] by rows; GPT-2's position table [12, h] and the
  // final LayerNorm (2h) whole; Llama's untied output matrix [V, h] by rows. V = 50, t = 2.
  const GptLayout full(gpt2), local(local_spec(gpt2, 2));
  CHECK(local.spec().vocab == 25);
  CHECK(local.unit_size(UnitKind::embedding) == 25 * h + 12 * h);
  CHECK(local.unit_size(UnitKind::head) == 2 * h);  // tied: the norm only
  const GptLayout llama_local(local_spec(llama, 2));
  CHECK(llama_local.unit_size(UnitKind::embedding) == 25 * h);
  CHECK(llama_local.unit_size(UnitKind::head) == h + 25 * h);
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
    const std::int64_t half_q = model.q_width() / 2, half_i = model.intermediate / 2;
    const std::int64_t h = model.hidden;
    const std::int64_t q0 = F.q.weight + half_q * h, o0 = F.o.weight + half_q;
    const std::int64_t down1 = F.down.weight + half_i + 1;
    CHECK(gathered[static_cast<std::size_t>(ln + L.q.weight)] == static_cast<float>(q0));
    CHECK(gathered[static_cast<std::size_t>(ln + L.o.weight)] == static_cast<float>(o0));
    CHECK(gathered[static_cast<std::size_t>(ln + L.down.weight + 1)] == static_cast<float>(down1));
    CHECK(assemble_unit(full, local, 1, gathered, t) == values);
  }
}

TEST_CASE("tensor_parallel::rank r holds the r-th vocabulary shard of the embedding and head") {
  // Llama (untied, V = 50, h = 16): rank 1 holds token rows 25..49 of the embedding and of the
  // output matrix, the final RMSNorm whole; GPT-2: the position table whole after its shard.
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    const GptLayout full(model), local(local_spec(model, 2));
    const std::int64_t h = model.hidden, rows = 25 * h;
    for (UnitKind kind : {UnitKind::embedding, UnitKind::head}) {
      const std::int64_t unit = kind == UnitKind::embedding ? 0 : full.unit_count() - 1;
      const std::int64_t n = full.unit_size(kind), ln = local.unit_size(kind);
      std::vector<float> values(static_cast<std::size_t>(n));
      std::iota(values.begin(), values.end(), 0.0f);
      std::vector<float> gathered(static_cast<std::size_t>(2 * ln));
      for (int r = 0; r < 2; ++r)
        slice_unit<float>(values,
                          std::span(gathered).subspan(static_cast<std::size_t>(r * ln),
                                                      static_cast<std::size_t>(ln)),
                          slice_segments(full, local, kind, 2, r));
      if (kind == UnitKind::embedding) {
        CHECK(gathered[static_cast<std::size_t>(ln + local.embedding().tokens)] ==
              float(full.embedding().tokens + rows));
        if (full.embedding().positions != kAbsent)
          CHECK(gathered[static_cast<std::size_t>(ln + local.embedding().positions)] ==
                float(full.embedding().positions));
      } else if (full.head().output != kAbsent) {
        CHECK(gathered[static_cast<std::size_t>(ln + local.head().output)] ==
              float(full.head().output + rows));
        CHECK(gathered[static_cast<std::size_t>(ln + local.head().norm.weight)] ==
              float(full.head().norm.weight));
      }
      CHECK(assemble_unit(full, local, unit, gathered, 2) == values);
    }
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
  // GPT-2's 4 heads and 32 intermediate columns split over 4, its vocabulary of 50 does not.
  CHECK_THROWS_WITH_AS(check_tensor_parallel(tiny_gpt2(), 4),
                       "tensor-parallel size 4 does not divide the vocabulary of 50 tokens (the "
                       "embedding and the head are vocabulary-parallel: give a vocabulary that is "
                       "a multiple of 4)",
                       std::invalid_argument);
  StandInCommunicator world(0, 3);
  CHECK_THROWS_WITH_AS(make_tensor_parallel_groups(world, 2),
                       "tensor-parallel size 2 does not divide the 3 ranks", std::invalid_argument);
}

TEST_CASE("tensor_parallel::a run's --tensor-parallel is checked against the plan") {
  documents::Plan p;
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
  const auto plan = documents::plan_to_json(p);
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
  CHECK(where(documents::plan_to_json(p), 2, 3) ==
        "--tensor-parallel --tensor-parallel: 2 does not divide the 3 ranks");
}
