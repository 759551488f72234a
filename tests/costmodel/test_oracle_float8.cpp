// torchao's Float8 training of torchtitan's block, as torchtitan 0.3.0's Float8LinearConverter
// applies it, against what the block keeps on a CPU (validation/measure_float8_units.py:
// tests/costmodel/data/oracle_float8_units.json; torchao 0.18.0, torch 2.15.0, FSDP2 bf16 on a
// 1-rank gloo mesh; torch's CPU _scaled_mm runs the fp8 GEMMs): per block, the bytes autograd
// (eager) or AOTAutograd's partition (compiled) saves, through the block table the walk uses
// (costmodel/block_table.cpp).
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "costmodel/accounting.hpp"
#include "costmodel/block_linears.hpp"
#include "documents/model.hpp"
#include "oracle_corpus.hpp"

using namespace shardplan;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

Checkpointing checkpointing_of(const std::string& s) {
  if (s == "full") return Checkpointing::full;
  return s == "selective-op" ? Checkpointing::selective_op : Checkpointing::none;
}

}  // namespace

// Eager, torchao's matmul_with_hp_or_float8_args saves its 16-bit input and weight, as aten::mm
// does: every checkpointing mode keeps what the bf16 block keeps (and torchtitan's save list
// still counts the aten::mm it sees on the Float8 tensors). Compiled, with every linear
// converted, the partition keeps less (block_table.cpp, compiled_llama_rows).
TEST_CASE("oracle_float8::a Float8 block keeps what torchao and the compiled partition save") {
  const auto corpus = oracle::read_corpus("oracle_float8_units.json");
  int compared = 0;
  std::set<std::string> other;
  for (const auto& c : corpus.at("cases")) {
    const std::string id = c.at("id").get<std::string>();
    CAPTURE(id);
    const std::string setting = c.at("float8").at("setting").get<std::string>();
    // torchtitan 0.3.0 offers rowwise and rowwise_with_gw_hp (and no Float8 at all); the corpus'
    // tensorwise rows and torchao's FSDP float8 all-gather are torchao's, outside its options.
    if (setting != "none" && setting != "rowwise" && setting != "rowwise_with_gw_hp") {
      other.insert(setting);
      continue;
    }
    const ModelSpec m = model_from_hf_config(
        corpus.at("configs").at(c.at("config").get<std::string>()), "torchtitan");
    TrainingJob j;
    j.recipe = Recipe::torchtitan;
    j.compile = c.at("mode").get<std::string>() == "compiled";
    j.seq_len = c.at("seq_len").get<std::int64_t>();
    j.micro_batch = c.at("micro_batch").get<std::int64_t>();
    j.global_batch = j.micro_batch;
    j.attention = AttentionImpl::flash;
    j.precision = Precision::bf16_mixed;
    j.checkpointing = checkpointing_of(c.at("checkpointing").get<std::string>());
    j.float8 = setting == "none"      ? Float8Recipe::none
               : setting == "rowwise" ? Float8Recipe::rowwise
                                      : Float8Recipe::rowwise_with_gw_hp;
    // The converter's choice: the block's five linears (sizes multiples of 16), not lm_head
    // (1000 outputs).
    if (j.float8 != Float8Recipe::none) {
      CHECK(float8_whole_block(m, j));
      CHECK_FALSE(head_float8(m, j));
      for (const auto& l : c.at("block0_linears")) CHECK(l.at("float8").get<bool>());
    }
    const Forward f{2, 2, false};  // FSDP2's bf16 parameters, no autocast, on a CPU
    const double predicted =
        block_activations(m, j, f, j.checkpointing == Checkpointing::full).saved;
    for (const char* unit : {"block 0", "block 1", "block 2"})
      CHECK(predicted == c.at("units").at(unit).at("activation_bytes").get<double>());
    ++compared;
  }
  MESSAGE("Float8 cases compared: " << compared);
  // none: eager x (none, full, selective-op) x 4 shapes, compiled none at one shape and
  // selective-op at two; rowwise: eager none and selective-op x 4 shapes, eager full x 2,
  // compiled none and selective-op x 2 and full x 1; rowwise_with_gw_hp: eager none x 1.
  CHECK(compared == 15 + 15 + 1);
  CHECK(other.size() == 6);
}
