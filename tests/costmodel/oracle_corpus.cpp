#include "oracle_corpus.hpp"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "core/json_reader.hpp"
#include "costmodel/accounting.hpp"
#include "costmodel/traffic.hpp"
#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "documents/recipe.hpp"

namespace shardplan::oracle {

using namespace costmodel;
using namespace core;
using namespace documents;

namespace {

// The job a corpus case ran: its shape, precision, attention, loss, checkpointing and recipe.
TrainingJob job_of(const nlohmann::json& c) {
  TrainingJob j;
  j.seq_len = c.at("seq_len").get<std::int64_t>();
  j.micro_batch = c.at("micro_batch").get<std::int64_t>();
  j.global_batch = j.micro_batch;
  j.precision = precision_from_name(c.at("precision").get<std::string>(), "precision");
  j.attention = attention_from_name(c.at("attention").get<std::string>(), "attention");
  j.recipe = recipe_from_name(c.value("recipe", std::string("hf")), "recipe");
  j.loss = recipe_traits(j.recipe).loss;
  set_loss(j, c.at("loss").get<std::string>(), "loss");
  set_checkpointing(j, c.at("checkpointing").get<std::string>(), "checkpointing");
  return j;
}

// The model a case ran, from the corpus's configs.
ModelSpec model_of(const nlohmann::json& configs, const nlohmann::json& c) {
  const std::string config = c.at("config").get<std::string>();
  return model_from_hf_config(configs.at(config), config);
}

Row row(const nlohmann::json& c, const std::string& quantity, double predicted, double measured,
        const std::string& skipped) {
  return {c.at("id").get<std::string>(),
          c.value("recipe", std::string("hf")),
          quantity,
          predicted,
          measured,
          skipped};
}

}  // namespace

std::string cpu_only_reason(const nlohmann::json& configs, const nlohmann::json& c) {
  const ModelSpec m = model_of(configs, c);
  if (m.attention_dropout && c.at("attention") == "flash")
    return "dropout in sdpa: the CPU falls back to its math path (CUDA's flash kernel drops out "
           "inside)";
  // measure_units.py records the kernel as attention_kernel, the step harnesses as sdpa_kernel.
  for (const char* key : {"attention_kernel", "sdpa_kernel"})
    if (c.value(key, std::string()).find("math") != std::string::npos)
      return "sdpa ran its math path on CPU";
  return "";
}

nlohmann::json read_corpus(const std::string& file_name) {
  const std::string path = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/costmodel/data/" + file_name;
  return read_json_file(path);
}

nlohmann::json read_corpus_file(const std::string& path) { return read_json_file(path); }

std::vector<Row> unit_rows(const nlohmann::json& corpus) {
  std::vector<Row> rows;
  const auto& configs = corpus.at("configs");
  for (const auto& c : corpus.at("cases")) {
    const ModelSpec m = model_of(configs, c);
    const TrainingJob j = job_of(c);
    const std::string skipped = cpu_only_reason(configs, c);
    // e: the compute dtype; p: the parameters the forward reads (fp32 under autocast, 16-bit
    // when FSDP2's MixedPrecisionPolicy hands the block its unsharded bf16 parameters).
    // Measured on CPU: no CUDA kernels (cuda = false).
    const double e = j.precision == Precision::fp32 ? 4 : 2;
    const double p = c.at("mixed_precision_mechanism").get<std::string>() == "autocast" ? 4 : e;
    const Forward f{e, p, false};
    const auto& units = c.at("units");
    const double T = static_cast<double>(j.seq_len * j.micro_batch);
    double predicted_total = 0, measured_total = 0;

    // The embeddings; the rotary tables they compute are kept by the first block that saves
    // them (the corpus counts each storage once, in the first unit that saves it).
    // The mask checkpointed blocks keep is likewise counted in the first of them when it is a
    // positional argument (GPT-2's eager mask); one passed by keyword (transformers'
    // sliding-window mask) stays alive in the recompute's closure, which the harness does not
    // see (validation/measure_units.py), so it is counted in no unit here.
    const double rotary = rotary_table_bytes(m, j, p);
    const double all_masks = checkpointed_mask_bytes(m, j, p);
    const double mask = m.architecture == Architecture::gpt2 ? all_masks : 0;
    const double embedding = embedding_activations(m, j, f).saved - rotary - all_masks;
    const double measured_embedding = units.at("embedding").at("activation_bytes").get<double>();
    rows.push_back(row(c, "embedding", embedding, measured_embedding, skipped));
    predicted_total += embedding;
    measured_total += measured_embedding;

    bool rotary_counted = false, mask_counted = false;
    for (std::int64_t b = 0; b < m.layers; ++b) {
      const bool checkpointed = j.block_checkpointed(b);
      double predicted = block_activations(m, j, f, checkpointed).saved;
      // torch.utils.checkpoint keeps the block's keyword inputs (cos, sin) in its closure, out
      // of the hooks' view: a checkpointed block's and one under torchtitan's save list (its
      // SelectiveAC wraps the block in the same checkpoint).
      const bool wrapped = checkpointed || j.checkpointing == Checkpointing::selective_op;
      if (!wrapped && !rotary_counted) {
        predicted += rotary;
        rotary_counted = true;
      }
      if (checkpointed && !mask_counted) {
        predicted += mask;
        mask_counted = true;
      }
      const std::string name = "block " + std::to_string(b);
      const double measured = units.at(name).at("activation_bytes").get<double>();
      rows.push_back(row(c, name, predicted, measured, skipped));
      predicted_total += predicted;
      measured_total += measured;
    }

    // The head. A chunked loss's gradient accumulator is held by the loss
    // wrapper, and the corpus counts the largest chunk's saved tensors (its lm_head input — a
    // view of the whole hidden states when b = 1, a copy of the chunk otherwise — the fp32
    // log-probabilities and the chunk's labels).
    const auto head = head_activations(m, j, f);
    double predicted_head = head.saved;
    const double measured_head = units.at("head").at("activation_bytes").get<double>();
    if (j.loss == LossImpl::chunked) {
      const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
      const double C = T / static_cast<double>(j.loss_chunks);
      predicted_head +=
          -e * T * h + (j.micro_batch == 1 ? e * T * h : e * C * h) + 4 * C * V + 8 * C;
    }
    rows.push_back(row(c, "head", predicted_head, measured_head, skipped));
    predicted_total += predicted_head;
    measured_total += measured_head;
    rows.push_back(row(c, "total", predicted_total, measured_total, skipped));
  }
  return rows;
}

std::vector<Row> traffic_rows(const nlohmann::json& corpus) {
  std::vector<Row> rows;
  const auto& configs = corpus.at("configs");
  for (const auto& c : corpus.at("cases")) {
    const ModelSpec m = model_of(configs, c);
    const TrainingJob j = job_of(c);
    // transformers' models run under autocast (fp32 parameters, e-byte GEMMs); torchtitan's
    // blocks read the bf16 parameters FSDP2 hands them. Measured on CPU (cuda = false).
    const double e = j.precision == Precision::fp32 ? 4 : 2;
    const double p = j.recipe == Recipe::hf ? 4 : e;
    const Forward f{e, p, false};
    const auto& units = c.at("units");
    auto measured = [&](const std::string& unit, const char* direction, const char* what) {
      const auto& u = units.at(unit);
      if (!u.contains(direction) || !u.at(direction).contains("memory_bound")) return 0.0;
      return u.at(direction).at("memory_bound").at(what).get<double>();
    };
    auto add = [&](const std::string& unit, const Traffic& t, const Traffic& recompute,
                   const std::string& skip) {
      rows.push_back(row(c, unit + "/forward", t.forward, measured(unit, "forward", "bytes"), ""));
      rows.push_back(row(c, unit + "/backward", t.backward + recompute.forward,
                         measured(unit, "backward", "bytes"), skip));
      rows.push_back(
          row(c, unit + "/forward ops", t.forward_ops, measured(unit, "forward", "ops"), ""));
      rows.push_back(row(c, unit + "/backward ops", t.backward_ops + recompute.forward_ops,
                         measured(unit, "backward", "ops"), skip));
    };
    // GPT-2's position table gets its gradient after the token table's backward began or before
    // it: the hooks cannot tell which unit ran it.
    add("embedding", embedding_traffic(m, j, f), {},
        m.positions == PositionKind::learned ? "the position table's backward is not attributed"
                                             : "");
    const Traffic block = block_traffic(m, j, f);
    add("block 1", block,
        j.block_checkpointed(1) || j.checkpointing == Checkpointing::selective_op
            ? recompute_traffic(m, j, f)
            : Traffic{},
        "");
    add("head", head_traffic(m, j, f), {}, "");
  }
  return rows;
}

}  // namespace shardplan::oracle
