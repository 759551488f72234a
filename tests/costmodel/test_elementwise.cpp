// The layers that are not GEMMs: their passes per token, counted by hand, and the time the
// simulator adds for them on a profile that measured their rate.
#include <doctest/doctest.h>

#include "costmodel/elementwise.hpp"
#include "costmodel/simulator.hpp"

using namespace shardplan::costmodel;

TEST_CASE("elementwise::GPT-2's passes per token by hand") {
  // GPT-2 (h 768, 4h MLP 3072, GELU, LayerNorm, learned positions, V 50257). A block: two
  // LayerNorms 2·768·(2 + 4), two residual adds 2·768·(2 + 3), GELU 3072·(2 + 4).
  const auto m = load_model("gpt2");
  const Passes block = passes_per_token(block_elementwise_ops(m));
  CHECK(block.forward == 2 * 768 * 2 + 2 * 768 * 2 + 3072 * 2);
  CHECK(block.backward == 2 * 768 * 4 + 2 * 768 * 3 + 3072 * 4);
  // The head: the final LayerNorm and the log-softmax over the vocabulary.
  const Passes head = passes_per_token(head_elementwise_ops(m));
  CHECK(head.forward == 768 * 2 + 50257 * 2);
  CHECK(head.backward == 768 * 4 + 50257 * 3);
  // Token and position rows.
  const Passes emb = passes_per_token(embedding_elementwise_ops(m));
  CHECK(emb.forward == 2 * 768 * 2);
  CHECK(emb.backward == 2 * 768 * 3);
}

TEST_CASE("elementwise::Llama's SwiGLU, RMSNorm and rotary") {
  // llama-2-7b: h 4096, MLP 11008 (SwiGLU), 32 heads x 128 for q and k (no GQA).
  const auto m = load_model("llama-2-7b");
  const Passes block = passes_per_token(block_elementwise_ops(m));
  CHECK(block.forward == 2 * 4096 * 2 + 2 * 4096 * 2 + 11008 * 3 + (4096 + 4096) * 2);
  CHECK(block.backward == 2 * 4096 * 4 + 2 * 4096 * 3 + 11008 * 7 + (4096 + 4096) * 2);
  // A bare parameter count has no embeddings.
  CHECK(embedding_elementwise_ops(model_from_param_count(1e9)).empty());
}

TEST_CASE("elementwise::a measured rate times exactly its passes") {
  // One rank, DDP, one micro-batch of 2 x 128 tokens of the executor's model: the compute stream's
  // memory-bound time is every unit's passes (forward and backward) x tokens / rate, by the
  // definition of the rate (calibrate times the executor's kernels).
  const auto m = load_model("gpt2");
  auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {1, 1};
  in.job.seq_len = 128;
  in.job.global_batch = 2;
  in.job.micro_batch = 2;
  in.job.recipe = Recipe::executor;
  in.spec = make_spec("ddp", std::nullopt, 1);
  Calibration c;
  c.backend = "mpi";
  c.ranks = 1;
  const double rate = 1e9;  // passes per second
  c.elementwise_elems_per_s = rate;
  hw.calibration = c;
  double passes = 0;
  for (const auto& ops : {embedding_elementwise_ops(m), head_elementwise_ops(m)}) {
    const Passes p = passes_per_token(ops);
    passes += p.forward + p.backward;
  }
  const Passes b = passes_per_token(block_elementwise_ops(m));
  passes += 12 * (b.forward + b.backward);
  const auto r = simulate_step(in);
  CHECK(r.compute_by_kind_s[static_cast<int>(ComputeKind::memory_bound)] ==
        doctest::Approx(256 * passes / rate).epsilon(1e-9));
}
