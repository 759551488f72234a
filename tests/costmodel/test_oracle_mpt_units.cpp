// llm-foundry's own MPT block against the cost model's (costmodel/block_table.cpp, mpt_rows,
// lp_layernorm and lp_rmsnorm): what autograd saves per unit in llm-foundry 0.22.0's MPTForCausalLM
// on CPU, measured with saved_tensors_hooks by validation/measure_mpt_units.py
// (tests/costmodel/data/oracle_mpt_units.json), under Composer's precisions: fp32, bf16 autocast
// over fp32 parameters (FSDP's "FULL", or DDP), bf16 autocast over bf16 parameters (FSDP1's
// "DEFAULT" mixed precision). attn_impl "torch". A variant the cost model refuses (mpt_unmodeled)
// would be counted apart, with its reason: none is.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include "costmodel/accounting.hpp"
#include "costmodel/block_table.hpp"
#include "documents/model.hpp"
#include "oracle_corpus.hpp"

using namespace shardplan;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

double bytes(const nlohmann::json& units, const char* unit, const char* kind) {
  return units.at(unit).at(kind).get<double>();
}

}  // namespace

TEST_CASE("oracle_mpt::every MPT unit's saved bytes are llm-foundry's own") {
  const auto corpus = oracle::read_corpus("oracle_mpt_units.json");
  int compared = 0;
  std::set<std::string> refused;
  for (const auto& c : corpus.at("cases")) {
    const std::string id = c.at("id").get<std::string>();
    CAPTURE(id);
    const ModelSpec m =
        model_from_hf_config(corpus.at("configs").at(c.at("config").get<std::string>()), id);
    TrainingJob j;
    j.recipe = Recipe::llm_foundry;
    j.seq_len = c.at("seq_len").get<std::int64_t>();
    j.micro_batch = c.at("micro_batch").get<std::int64_t>();
    j.attention = AttentionImpl::eager;  // attn_impl "torch"
    const std::string precision = c.at("precision").get<std::string>();
    j.precision = precision == "fp32" ? Precision::fp32 : Precision::bf16_mixed;
    if (const auto why = mpt_unmodeled(m, j); !why.empty()) {
      refused.insert(why);
      continue;
    }
    // e: the compute dtype; p: the parameters the forward reads (fp32 under autocast, bf16
    // where FSDP1's DEFAULT hands over bf16 parameters). Measured on a CPU.
    const double e = precision == "fp32" ? 4 : 2;
    const double p = precision == "bf16-default" ? 2 : 4;
    const Forward f{e, p, false};
    const auto& units = c.at("units");
    const double block = block_activations(m, j, f, false).saved;
    for (const char* unit : {"block 0", "block 1"}) {
      CHECK(block == bytes(units, unit, "activation_bytes"));
      // Autocast's cast of each GEMM weight, kept for backward (the walk counts them apart).
      CHECK((p > e ? e * static_cast<double>(m.block.matmul_params()) : 0) ==
            bytes(units, unit, "weight_copy_bytes"));
    }
    CHECK(final_norm_parts(m, j, f).state == bytes(units, "final norm", "activation_bytes"));
    CHECK(embedding_activations(m, j, f).saved == bytes(units, "embedding", "activation_bytes"));
    ++compared;
  }
  MESSAGE("MPT cases compared: " << compared << "; refused variants: " << refused.size());
  // MHA with either FFN, biases or not, ALiBi, the low-precision RMSNorm, grouped and
  // multi-query heads (kv_n_heads 2 and 1, and multiquery_attention), qk_ln, qk_gn, clip_qkv,
  // rope_impl hf, GQA with rope, mptglu and the RMSNorm, and attn_pdrop, resid_pdrop and emb_pdrop
  // (their noise in the dropped tensor's dtype on a CPU): 14 configs at three precisions and two
  // shapes (b = 1, where the attention's operands are views, and b = 2, where they are copies).
  CHECK(compared == 84);
  CHECK(refused.empty());
}
