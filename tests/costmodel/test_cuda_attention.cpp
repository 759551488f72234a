// What a GPU run keeps that the CPU corpus cannot show: GPT-2's default attention dropout under
// sdpa. On a CPU, sdpa with dropout_p > 0 takes its math path (scores, softmax and the dropout
// noise materialized), so those corpus cases are set aside; on CUDA the fused kernels draw the
// dropout inside from a philox state and keep no mask. The numbers below are derived by hand from
// torch's sources (tools/autograd/derivatives.yaml: what each kernel's backward reads;
// torch/_meta_registrations.py: the shapes; flash_api.cpp: rng_state [2] and an unused 0-dim
// word, 8 bytes each) and from transformers' GPT2Block (modeling_gpt2.py) — not measured.
#include <doctest/doctest.h>

#include "costmodel/accounting.hpp"
#include "documents/model.hpp"

using namespace shardplan;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

TrainingJob gpt2_job(std::int64_t seq_len, std::int64_t micro_batch) {
  TrainingJob j;
  j.seq_len = seq_len;
  j.micro_batch = micro_batch;
  j.global_batch = micro_batch;
  j.recipe = Recipe::hf;
  j.attention = AttentionImpl::flash;
  j.checkpointing = Checkpointing::none;
  return j;
}

}  // namespace

TEST_CASE("cuda_attention::gpt2 with dropout under the flash kernel keeps no mask") {
  // openai-community/gpt2: h = 768, a = 12, I = 3072, attn/resid/embd_pdrop 0.1, gelu_new.
  const auto m = load_model("gpt2");
  REQUIRE(m.attention_dropout);
  REQUIRE(m.residual_dropout);
  // bf16 autocast on CUDA (e = 2; parameters and residual stream fp32, 4), s = 1024, b = 4:
  // T = 4096 tokens. Per block, bytes:
  //   ln_1 and ln_2: fp32 input 4·T·h = 12,582,912 each, mean and rstd 8·T = 32,768 each;
  //   the bf16 casts c_attn and c_fc keep: 2·T·h = 6,291,456 each;
  //   c_attn's output (q, k, v are views of it): 3·2·T·h = 18,874,368;
  //   the flash kernel: its output 2·T·h = 6,291,456, logsumexp fp32 [b, a, s] 4·12·4096 =
  //   196,608 (its rng_state and unused word, 24 bytes, are left out by the model) — no mask,
  //   no probabilities;
  //   resid_dropout after attention and after the MLP: bool masks T·h = 3,145,728 each;
  //   gelu_new's MLP: c_fc output, pow's input is the same, tanh, 0.5·x, 1 + tanh and c_proj's
  //   input, 5·2·T·I = 125,829,120.
  // Sum: 25,165,824 + 65,536 + 12,582,912 + 18,874,368 + 6,291,456 + 196,608 + 6,291,456
  //      + 125,829,120 = 195,297,280.
  const auto bf16 = block_activations(m, gpt2_job(1024, 4), {2.0, 4.0, true}, false);
  CHECK(bf16.saved == 195'297'280.0);
  // The CPU's kernel with the same shapes (no dropout there: the corpus's nodrop cases) keeps the
  // logsumexp alone, and a 2-byte-per-element noise instead of the bool masks: the difference is
  // the masks' width.
  const auto cpu = block_activations(m, gpt2_job(1024, 4), {2.0, 4.0, false}, false);
  CHECK(bf16.saved - cpu.saved == doctest::Approx(-2 * 3'145'728.0));
  // fp32 on CUDA runs the memory-efficient kernel: s = 1000 pads its logsumexp to 1024 queries,
  // 4·12·4·1024 = 196,608, not 4·12·4000 = 192,000 (its 8-byte philox seed and offset are left
  // out).
  // T = 4000: ln_1 and ln_2 2·(4·T·h + 8·T) = 24,576,000 + 64,000; c_attn and c_fc keep the
  // LayerNorms' outputs (no cast) 2·4·T·h = 24,576,000; qkv 3·4·T·h = 36,864,000; the output
  // 4·T·h = 12,288,000; masks 2·T·h = 6,144,000; MLP 5·4·T·I = 245,760,000.
  // Sum: 24,640,000 + 24,576,000 + 36,864,000 + 12,288,000 + 196,608 + 6,144,000
  //      + 245,760,000 = 350,468,608.
  const auto fp32 = block_activations(m, gpt2_job(1000, 4), {4.0, 4.0, true}, false);
  CHECK(fp32.saved == 350'468'608.0);
}
