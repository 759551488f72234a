#include "executor/model_layout.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "core/input_error.hpp"

namespace shardplan::executor {
namespace {

using documents::Architecture;
using documents::ModelSpec;
using documents::UnitTensors;

// The Hugging Face names of each role (documents/model.cpp builds the lists from them).
struct BlockNames {
  const char* norm1;
  const char* norm2;
  const char* q;  // separate projections, or nullptr when fused
  const char* k;
  const char* v;
  const char* qkv;  // fused projection, or nullptr
  const char* o;
  const char* up;
  const char* gate;  // SwiGLU only
  const char* down;
};

struct UnitNames {
  const char* token_embedding;
  const char* position_embedding;  // nullptr without learned positions
  BlockNames block;
  const char* final_norm;
  const char* output;
};

UnitNames names_of(Architecture a) {
  switch (a) {
  case Architecture::llama:
  case Architecture::mistral:
  case Architecture::qwen2:
    // HF modeling_llama.py (LlamaDecoderLayer, LlamaAttention, LlamaMLP).
    return {"embed_tokens",
            nullptr,
            {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
             "self_attn.v_proj", nullptr, "self_attn.o_proj", "mlp.up_proj", "mlp.gate_proj",
             "mlp.down_proj"},
            "norm",
            "lm_head"};
  case Architecture::gpt2:
    // HF modeling_gpt2.py (GPT2Block, GPT2Attention, GPT2MLP).
    return {"wte",
            "wpe",
            {"ln_1", "ln_2", nullptr, nullptr, nullptr, "attn.c_attn", "attn.c_proj", "mlp.c_fc",
             nullptr, "mlp.c_proj"},
            "ln_f",
            "lm_head"};
  case Architecture::gpt_neox:
    // HF modeling_gpt_neox.py (GPTNeoXLayer, GPTNeoXAttention, GPTNeoXMLP).
    return {"embed_in",
            nullptr,
            {"input_layernorm", "post_attention_layernorm", nullptr, nullptr, nullptr,
             "attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", nullptr,
             "mlp.dense_4h_to_h"},
            "final_layer_norm",
            "embed_out"};
  case Architecture::mpt:
    throw core::InputError("/architectures",
                           "the executor runs GPT-2's, the Llama family's and GPT-NeoX's blocks, "
                           "not MPT's (its ALiBi and low-precision norms)");
  case Architecture::mixtral:
  case Architecture::qwen2_moe:
  case Architecture::qwen3_moe:
  case Architecture::olmoe:
    throw core::InputError("/architectures",
                           "the executor runs GPT-2's, the Llama family's and GPT-NeoX's blocks, "
                           "not a mixture of experts'");
  case Architecture::uniform:
    break;
  }
  throw core::InputError("/architectures",
                         "a bare parameter count has no layers to execute; give a model config");
}

// Offsets of one unit's tensors, and which of them a role has claimed.
class UnitIndex {
public:
  UnitIndex(const UnitTensors& unit, const char* unit_name) : unit_name_(unit_name) {
    std::int64_t offset = 0;
    for (const auto& t : unit.tensors) {
      slots_.push_back({t, offset});
      offset += t.elements();
    }
    size_ = offset;
    claimed_.assign(slots_.size(), false);
  }

  // Offset of `name`, checked to have `rows` × `cols` elements; kAbsent if missing and optional.
  std::int64_t take(const std::string& name, std::int64_t rows, std::int64_t cols, bool required) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const auto& t = slots_[i].tensor;
      if (t.name != name) continue;
      if (t.rows != rows || t.cols != cols)
        throw std::invalid_argument(fmt::format("{} tensor {} is [{}, {}], expected [{}, {}]",
                                                unit_name_, name, t.rows, t.cols, rows, cols));
      claimed_[i] = true;
      return slots_[i].offset;
    }
    if (required)
      throw std::invalid_argument(fmt::format("{} unit has no tensor {}", unit_name_, name));
    return kAbsent;
  }

  NormOffsets norm(const std::string& prefix, const ModelSpec& m) {
    const bool layernorm = m.norm == documents::NormKind::layernorm;
    return {take(prefix + ".weight", 1, m.hidden, true),
            take(prefix + ".bias", 1, m.hidden, layernorm)};
  }

  LinearOffsets linear(const std::string& prefix, std::int64_t out, std::int64_t in) {
    return {take(prefix + ".weight", out, in, true), take(prefix + ".bias", 1, out, false), out,
            in};
  }

  // Every tensor of the unit must have a role: otherwise the executor would silently not train it.
  void check_all_claimed() const {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (!claimed_[i])
        throw std::invalid_argument(fmt::format("{} tensor {} has no role in the executor's model",
                                                unit_name_, slots_[i].tensor.name));
  }

  std::int64_t size() const { return size_; }
  const std::vector<TensorSlot>& slots() const { return slots_; }

private:
  const char* unit_name_;
  std::vector<TensorSlot> slots_;
  std::vector<bool> claimed_;
  std::int64_t size_ = 0;
};

}  // namespace

GptLayout::GptLayout(const ModelSpec& spec) : spec_(spec) {
  const UnitNames names = names_of(spec.architecture);
  const ModelSpec& m = spec_;
  if (m.hidden < 1 || m.layers < 1 || m.heads < 1 || m.kv_heads < 1 || m.head_dim < 1 ||
      m.intermediate < 1 || m.vocab < 1)
    throw std::invalid_argument("model dimensions must all be >= 1");
  if (m.heads % m.kv_heads != 0)
    throw std::invalid_argument(
        fmt::format("{} key/value heads do not divide {} query heads", m.kv_heads, m.heads));
  if (m.positions == documents::PositionKind::rotary && m.head_dim % 2 != 0)
    throw std::invalid_argument(
        fmt::format("rotary positions need an even head_dim, got {}", m.head_dim));
  const bool swiglu = m.mlp == documents::MlpKind::swiglu;

  UnitIndex emb(m.embedding, "embedding");
  embedding_.tokens =
      emb.take(std::string(names.token_embedding) + ".weight", m.vocab, m.hidden, true);
  if (m.positions == documents::PositionKind::learned) {
    if (!names.position_embedding)
      throw std::invalid_argument("learned positions without a position table");
    embedding_.positions = emb.take(std::string(names.position_embedding) + ".weight",
                                    m.max_positions, m.hidden, true);
  }
  emb.check_all_claimed();
  embedding_.size = emb.size();
  embedding_slots_ = emb.slots();

  UnitIndex blk(m.block, "block");
  const BlockNames& b = names.block;
  block_.norm1 = blk.norm(b.norm1, m);
  block_.norm2 = blk.norm(b.norm2, m);
  if (b.qkv) {
    const LinearOffsets fused = blk.linear(b.qkv, m.q_width() + 2 * m.kv_width(), m.hidden);
    auto part = [&](std::int64_t first_row, std::int64_t rows) {
      return LinearOffsets{fused.weight + first_row * m.hidden,
                           fused.bias == kAbsent ? kAbsent : fused.bias + first_row, rows,
                           m.hidden};
    };
    block_.q = part(0, m.q_width());
    block_.k = part(m.q_width(), m.kv_width());
    block_.v = part(m.q_width() + m.kv_width(), m.kv_width());
  } else {
    block_.q = blk.linear(b.q, m.q_width(), m.hidden);
    block_.k = blk.linear(b.k, m.kv_width(), m.hidden);
    block_.v = blk.linear(b.v, m.kv_width(), m.hidden);
  }
  block_.o = blk.linear(b.o, m.hidden, m.q_width());
  block_.up = blk.linear(b.up, m.intermediate, m.hidden);
  if (swiglu) {
    if (!b.gate) throw std::invalid_argument("a SwiGLU MLP without a gate projection");
    block_.gate = blk.linear(b.gate, m.intermediate, m.hidden);
  }
  block_.down = blk.linear(b.down, m.hidden, m.intermediate);
  blk.check_all_claimed();
  block_.size = blk.size();
  block_slots_ = blk.slots();

  UnitIndex hd(m.head, "head");
  head_.norm = hd.norm(names.final_norm, m);
  if (!m.tied_embeddings)
    head_.output = hd.take(std::string(names.output) + ".weight", m.vocab, m.hidden, true);
  hd.check_all_claimed();
  head_.size = hd.size();
  head_slots_ = hd.slots();
}

UnitKind GptLayout::unit_kind(std::int64_t unit) const {
  if (unit < 0 || unit >= unit_count())
    throw std::out_of_range(fmt::format("unit {} of a model with {} units", unit, unit_count()));
  if (unit == 0) return UnitKind::embedding;
  if (unit == unit_count() - 1) return UnitKind::head;
  return UnitKind::block;
}

std::int64_t GptLayout::unit_size(UnitKind kind) const {
  switch (kind) {
  case UnitKind::embedding:
    return embedding_.size;
  case UnitKind::block:
    return block_.size;
  case UnitKind::head:
    return head_.size;
  }
  return 0;
}

const std::vector<TensorSlot>& GptLayout::slots(UnitKind kind) const {
  switch (kind) {
  case UnitKind::embedding:
    return embedding_slots_;
  case UnitKind::block:
    return block_slots_;
  case UnitKind::head:
    return head_slots_;
  }
  return head_slots_;
}

}  // namespace shardplan::executor
