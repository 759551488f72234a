// A model's workload (documents/workload.hpp): the layers that are not GEMMs, their passes per
// token counted by hand, and the GEMMs of a step.
#include <doctest/doctest.h>

#include "documents/workload.hpp"

using namespace shardplan::documents;

TEST_CASE("workload::GPT-2's passes per token by hand") {
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

TEST_CASE("workload::Llama's SwiGLU, RMSNorm and rotary") {
  // llama-2-7b: h 4096, MLP 11008 (SwiGLU), 32 heads x 128 for q and k (no GQA).
  const auto m = load_model("llama-2-7b");
  const Passes block = passes_per_token(block_elementwise_ops(m));
  CHECK(block.forward == 2 * 4096 * 2 + 2 * 4096 * 2 + 11008 * 3 + (4096 + 4096) * 2);
  CHECK(block.backward == 2 * 4096 * 4 + 2 * 4096 * 3 + 11008 * 7 + (4096 + 4096) * 2);
  // A bare parameter count has no embeddings.
  CHECK(embedding_elementwise_ops(model_from_param_count(1e9)).empty());
}

TEST_CASE("workload::a linear layer's three GEMMs and the tied head's projection") {
  // GPT-2 (h 768, 4h MLP, V 50257, tied): c_attn is a [2304, 768] weight (HF's Conv1D stores
  // [768, 2304]; the model document keeps torch's [out, in]). Its forward over 256 tokens is
  // y[256, 2304] = x[256, 768]·Wᵀ; dx = dy·W is [256, 768] over k = 2304; dW = dyᵀ·x is
  // [2304, 768] over k = 256.
  const auto m = load_model("gpt2");
  const auto block = forward_gemms(m, UnitKind::block, 256);
  REQUIRE(block.size() == 4);  // c_attn, attn.c_proj, c_fc, mlp.c_proj
  CHECK(block[0].m == 256);
  CHECK(block[0].n == 2304);
  CHECK(block[0].k == 768);
  const auto back = backward_gemms(block[0]);
  CHECK((back[0].m == 256 && back[0].n == 768 && back[0].k == 2304));
  CHECK((back[1].m == 2304 && back[1].n == 768 && back[1].k == 256));
  // The head projects with the embedding matrix it is tied to, [50257, 768]; the embeddings run
  // no GEMM.
  const auto head = forward_gemms(m, UnitKind::head, 256);
  REQUIRE(head.size() == 1);
  CHECK((head[0].n == 50257 && head[0].k == 768));
  CHECK(forward_gemms(m, UnitKind::embedding, 256).empty());
  CHECK(head[0].flops() == 2.0 * 256 * 50257 * 768);
}
