// The blocks as tables (costmodel/block_table.hpp): where each recipe's rows sit under tensor
// parallelism, and the one checkpointing rule applied to every table.
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "costmodel/accounting.hpp"
#include "costmodel/block_linears.hpp"
#include "costmodel/block_table.hpp"
#include "costmodel/selective_op.hpp"
#include "costmodel/traffic.hpp"
#include "documents/recipe.hpp"
#include "tests/test_support.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

TrainingJob job(Recipe r, std::int64_t seq, AttentionImpl a, Checkpointing c) {
  TrainingJob j;
  j.seq_len = seq;
  j.micro_batch = 1;
  j.global_batch = 1;
  j.recipe = r;
  j.attention = a;
  j.checkpointing = c;
  return j;
}

}  // namespace

// Korthikanti et al. 2022, §4.1 and Table 2, GPT-3 175B's shapes (h = 12288, a = 96, s = 2048,
// b = 1, 2-byte activations, dropout): sbh = 25,165,824. Outside the column- and row-parallel
// linears 10·sbh = 251,658,240 (two norm inputs, the QKV and MLP inputs, two dropout masks);
// between them 24·sbh + 5·a·s²·b = 603,979,776 + 2,013,265,920 = 2,617,245,696, of which the
// core 5·a·s²·b.
TEST_CASE("block_table::Korthikanti's rows place Table 2's terms") {
  const json config = {{"architectures", {"GPT2LMHeadModel"}},
                       {"n_embd", 12288},
                       {"n_head", 96},
                       {"n_layer", 96},
                       {"n_positions", 2048},
                       {"vocab_size", 51200}};
  const ModelSpec m = model_from_hf_config(config, "gpt3-175b");
  const TrainingJob j = job(Recipe::megatron, 2048, AttentionImpl::eager, Checkpointing::none);
  const BlockTable b = block_table(m, j, Forward{2, 2, true});
  CHECK(placement_bytes(b, Placement::residual) + placement_bytes(b, Placement::linear_input) ==
        251658240.0);
  CHECK(placement_bytes(b, Placement::heads) == 2617245696.0);
  CHECK(rank_core_bytes(b, RankSplit{}) == 2013265920.0);
  for (const auto& row : b.saved) {
    CAPTURE(row.op);
    CHECK(row.bytes > 0);
    CHECK(std::string(row.tensor).size() > 0);
  }
}

// Megatron's selective recompute reruns the eager scores in any recipe's block, as the time
// side charges their rerun (compute_time.cpp, block_recompute). transformers' Llama-3-8B eager
// at s = 512, b = 1, bf16 on CUDA: softmax keeps its fp32 output and the matmul with v its bf16
// cast, 4 + 2 bytes per score; a·s·T = 32·512·512 = 8,388,608 scores: 50,331,648 bytes dropped.
TEST_CASE("block_table::selective recompute drops the eager scores of a framework's block") {
  const ModelSpec m = load_model("llama-3-8b");
  const Forward f{2, 2, true};
  const TrainingJob none = job(Recipe::hf, 512, AttentionImpl::eager, Checkpointing::none);
  const TrainingJob sel =
      job(Recipe::hf, 512, AttentionImpl::eager, Checkpointing::selective_attention);
  CHECK(block_activations(m, none, f, false).saved - block_activations(m, sel, f, false).saved ==
        50331648.0);
}

// The one split rule: PyTorch's styles keep the norms' outputs all-gathered, Megatron-core keeps
// the rank's sequence shard. transformers' Llama-3-8B, flash, s = 1024, b = 1, bf16 parameters
// (no autocast): each norm's output is kept once, 2·T·h = 8,388,608 bytes, two norms
// 16,777,216; at t = 4 with sequence parallelism the gathered copy holds 3/4 more of them:
// 12,582,912 bytes.
TEST_CASE("block_table::the norms' outputs gathered under PyTorch's styles, sharded by Megatron") {
  const ModelSpec m = load_model("llama-3-8b");
  const TrainingJob j = job(Recipe::hf, 1024, AttentionImpl::flash, Checkpointing::none);
  const BlockTable b = block_table(m, j, Forward{2, 2, true});
  CHECK(placement_bytes(b, Placement::linear_input) == 16777216.0);
  const RankSplit torch{4, 4, true}, megatron{4, 4, false};
  CHECK(rank_bytes(b, torch) - rank_bytes(b, megatron) == 12582912.0);
  // t = 1: either rule is the whole block.
  CHECK(rank_bytes(b, RankSplit{1, 1, true}) == rank_bytes(b, RankSplit{}));
}

// llm-foundry's MPT with rope_impl dail (its default), attn_impl torch, derived from flash-attn 2's
// rotary.py (its kernel needs CUDA, so no corpus case): q rotates in place in the Wqkv output and
// k in place in torch.stack([k, v]), a new [T, 2kv] tensor whose views k and v are. At b = 1 the
// attention's operands are views, so the stack is kept beside the Wqkv output: 2·T·kv·e more than
// the same model with learned positions, 2·64·64·4 = 32,768 bytes at s = 64 in fp32; at b = 2
// they are copies and the stack is kept by nothing.
TEST_CASE("block_table::MPT's rope dail keeps the stacked k and v where the attention views them") {
  json config = {{"architectures", {"MPTForCausalLM"}},
                 {"model_type", "mpt"},
                 {"d_model", 64},
                 {"n_heads", 4},
                 {"n_layers", 2},
                 {"expansion_ratio", 4},
                 {"max_seq_len", 128},
                 {"vocab_size", 128},
                 {"attn_config", {{"attn_impl", "torch"}}}};
  const ModelSpec learned = model_from_hf_config(config, "mpt");
  config["learned_pos_emb"] = false;
  config["attn_config"]["rope"] = true;
  const ModelSpec dail = model_from_hf_config(config, "mpt-rope");
  CHECK(dail.rope_in_place);
  const Forward f{4, 4, false};
  for (const std::int64_t b : {1, 2}) {
    TrainingJob j = job(Recipe::llm_foundry, 64, AttentionImpl::eager, Checkpointing::none);
    j.micro_batch = b;
    j.global_batch = b;
    CHECK(block_activations(dail, j, f, false).saved -
              block_activations(learned, j, f, false).saved ==
          (b == 1 ? 32768.0 : 0.0));
  }
}

// The block's memory-bound ops (costmodel/traffic.hpp, unit_ops) by hand, for transformers'
// GPT-NeoX (pythia-70m's shapes: h = 512, LayerNorm, parallel residual) in fp32 on a CPU, s = 64, b
// = 1: nn.LayerNorm is one kernel reading x and writing y, mean and rstd, 2·4·h + 8 = 4,104 bytes
// per token forward and 3·4·h + 8 = 6,152 backward; a residual add reads x and the branch and
// writes the sum, (2·4 + 4)·h = 6,144 bytes per token forward, 3·4·h = 6,144 backward. The residual
// stream's rows are exactly the two norms and the two adds: 64·2·(4,104 + 6,144) = 1,311,744
// bytes forward, 64·2·(6,152 + 6,144) = 1,573,888 backward. The parallel residual adds both
// branches after its last op, so transformers' early stop reruns neither add: the rerun's forward
// is the block's less 2·64·6,144 = 786,432 bytes; GPT-2's sequential block skips only the MLP's
// add, 64·(2·4 + 4)·768 = 589,824 bytes (h = 768).
TEST_CASE("block_table::a block's memory-bound ops: the residual stream's rows, the closing adds") {
  const TrainingJob j = job(Recipe::hf, 64, AttentionImpl::flash, Checkpointing::full);
  const Forward fp32{4, 4, false};
  const json pythia = {{"architectures", {"GPTNeoXForCausalLM"}},
                       {"hidden_size", 512},
                       {"intermediate_size", 2048},
                       {"num_attention_heads", 8},
                       {"num_hidden_layers", 6},
                       {"max_position_embeddings", 2048},
                       {"rotary_pct", 0.25},
                       {"use_parallel_residual", true},
                       {"vocab_size", 50304}};
  const ModelSpec neox = model_from_hf_config(pythia, "pythia-70m");
  REQUIRE(neox.parallel_residual);
  const Traffic residual = unit_traffic(neox, j, fp32, UnitKind::block, OpSpread::residual);
  CHECK(residual.forward == 1311744.0);
  CHECK(residual.backward == 1573888.0);
  CHECK(residual.forward_ops == 4);
  int closing = 0;
  for (const auto& op : unit_ops(neox, j, fp32, UnitKind::block)) closing += op.closes ? 1 : 0;
  CHECK(closing == 2);
  CHECK(block_traffic(neox, j, fp32).forward - recompute_traffic(neox, j, fp32).forward ==
        786432.0);

  const ModelSpec gpt2 = load_model("gpt2");
  REQUIRE_FALSE(gpt2.parallel_residual);
  CHECK(block_traffic(gpt2, j, fp32).forward - recompute_traffic(gpt2, j, fp32).forward ==
        589824.0);
  // torchtitan reruns the whole block (early_stop=False).
  const TrainingJob titan = job(Recipe::torchtitan, 64, AttentionImpl::flash, Checkpointing::full);
  const ModelSpec llama = load_model("llama-3-8b");
  CHECK(recompute_traffic(llama, titan, fp32).forward == block_traffic(llama, titan, fp32).forward);
}

// torchtitan's save list counts the block's aten::mm calls and reruns every second one
// (torchtitan 0.3.0, torchtitan/distributed/activation_checkpoint.py: mm_count, "except every
// second mm"). Llama-3-8B (h = 4096, q = 4096, kv = 1024, I = 14336), s = 1024, b = 1, bf16:
// torchtitan's block calls wqkv, wo, w1, w3, w2 and keeps wqkv's, w1's and w2's outputs,
// 6144 + 14336 + 4096 = 24,576 elements per token; transformers' block calls q, k, v, o, gate, up,
// down and keeps q's, v's, gate's and down's, 4096 + 1024 + 14336 + 4096 = 23,552: k's 1024 fewer,
// 2·1024·1024 = 2,097,152 bytes, and k's GEMM among the rerun. Qwen2's q, k and v carry biases
// (aten::addmm: in the save list, not counted): its mm are o, gate, up, down; gate and down rerun.
TEST_CASE("block_table::torchtitan's save list counts each block's own matmuls") {
  const ModelSpec llama = load_model("llama-3-8b");
  const Forward f{2, 2, true};
  const TrainingJob titan =
      job(Recipe::torchtitan, 1024, AttentionImpl::flash, Checkpointing::selective_op);
  const TrainingJob hf = job(Recipe::hf, 1024, AttentionImpl::flash, Checkpointing::selective_op);
  const auto reruns = [](const ModelSpec& m, const TrainingJob& j) {
    const auto mms = block_matmuls(m, j);
    const auto rerun = selective_op_reruns(mms);
    std::string names;
    for (std::size_t i = 0; i < mms.size(); ++i)
      if (rerun[i]) names += (names.empty() ? "" : " ") + mms[i].name;
    return names;
  };
  CHECK(reruns(llama, titan) == "attention.wo feed_forward.w3");
  CHECK(block_matmuls(llama, titan).front().name == "attention.qkv_linear.wqkv");
  CHECK(block_matmuls(llama, titan).front().out == 6144);
  CHECK(reruns(llama, hf) == "self_attn.k_proj self_attn.o_proj mlp.up_proj");
  CHECK(selective_op_saved(llama, titan, f, 1, 1) - selective_op_saved(llama, hf, f, 1, 1) ==
        2097152.0);

  const json qwen2 = {{"architectures", {"Qwen2ForCausalLM"}},
                      {"hidden_size", 896},
                      {"intermediate_size", 4864},
                      {"num_attention_heads", 14},
                      {"num_key_value_heads", 2},
                      {"num_hidden_layers", 24},
                      {"max_position_embeddings", 131072},
                      {"vocab_size", 151936}};
  const ModelSpec qwen = model_from_hf_config(qwen2, "qwen2-0.5b");
  CHECK(reruns(qwen, hf) == "mlp.gate_proj mlp.down_proj");
  CHECK_FALSE(selective_op_derived(load_model("gpt2"), hf));
  CHECK(selective_op_derived(load_model("gpt2"), titan));  // torchtitan runs its own block
}

// The block's linears, whose GEMMs the step times, with their tensor-parallel split: GPT-2's
// Block (transformers' modeling_gpt2: attn.c_attn [3h, h], attn.c_proj, mlp.c_fc [4h, h],
// mlp.c_proj; Conv1D with a bias, so aten::addmm) and Llama-2-7B's, whose q_proj is as wide as
// the residual stream (4096 = 4096) and still column-parallel (transformers' tp_plan "colwise";
// Megatron's ColumnParallelLinear for the fused QKV).
TEST_CASE("block_table::a block's linears are rows with their tensor-parallel split") {
  const TrainingJob hf = job(Recipe::hf, 1024, AttentionImpl::flash, Checkpointing::none);
  const auto layout = [&](const char* model) {
    std::string rows;
    for (const auto& mm : block_matmuls(load_model(model), hf))
      rows += fmt::format("{}{} {}x{}{}{}", rows.empty() ? "" : ", ", mm.name, mm.out, mm.in,
                          mm.row_parallel ? " row" : "", mm.mm ? " mm" : "");
    return rows;
  };
  CHECK(
      layout("gpt2") ==
      "attn.c_attn 2304x768, attn.c_proj 768x768 row, mlp.c_fc 3072x768, mlp.c_proj 768x3072 row");
  CHECK(layout("llama-2-7b") ==
        "self_attn.q_proj 4096x4096 mm, self_attn.k_proj 4096x4096 mm, self_attn.v_proj "
        "4096x4096 mm, self_attn.o_proj 4096x4096 row mm, mlp.gate_proj 11008x4096 mm, "
        "mlp.up_proj 11008x4096 mm, mlp.down_proj 4096x11008 row mm");
}
