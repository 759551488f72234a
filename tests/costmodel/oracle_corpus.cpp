#include "oracle_corpus.hpp"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "costmodel/accounting.hpp"
#include "costmodel/hardware.hpp"
#include "costmodel/json_reader.hpp"
#include "costmodel/model.hpp"
#include "costmodel/simulator.hpp"

namespace shardplan::oracle {

using namespace costmodel;

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
  j.loss = default_loss(j.recipe);
  set_loss(j, c.at("loss").get<std::string>(), "loss");
  set_checkpointing(j, c.at("checkpointing").get<std::string>(), "checkpointing");
  return j;
}

// Why a case says nothing about what a GPU run keeps (empty: it does).
std::string cpu_only_reason(const ModelSpec& m, const nlohmann::json& c) {
  if (m.attention_dropout || m.residual_dropout || m.embedding_dropout)
    return "dropout: on CPU at::dropout keeps its scaled noise in the input dtype and sdpa falls back "
           "to the math path; CUDA keeps 1-byte masks and dropout inside flash attention";
  if (c.value("attention_kernel", std::string()).find("math") != std::string::npos)
    return "sdpa ran its math path on CPU";
  return "";
}

Row row(const nlohmann::json& c, const std::string& quantity, double predicted, double measured,
        const std::string& skipped) {
  return {c.at("id").get<std::string>(), c.value("recipe", std::string("hf")), quantity, predicted, measured,
          skipped};
}

}  // namespace

nlohmann::json read_corpus(const std::string& file_name) {
  const std::string path = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/costmodel/data/" + file_name;
  return read_json_file(path);
}

std::vector<Row> unit_rows(const nlohmann::json& corpus) {
  std::vector<Row> rows;
  const auto& configs = corpus.at("configs");
  for (const auto& c : corpus.at("cases")) {
    const std::string config = c.at("config").get<std::string>();
    const ModelSpec m = model_from_hf_config(configs.at(config), config);
    const TrainingJob j = job_of(c);
    const std::string skipped = cpu_only_reason(m, c);
    // e: the compute dtype; p: the parameters the forward reads (fp32 under autocast, 16-bit
    // when FSDP2's MixedPrecisionPolicy hands the block its unsharded bf16 parameters).
    const double e = j.precision == Precision::fp32 ? 4 : 2;
    const double p = c.at("mixed_precision_mechanism").get<std::string>() == "autocast" ? 4 : e;
    const auto& units = c.at("units");
    const double T = static_cast<double>(j.seq_len * j.micro_batch);
    double predicted_total = 0, measured_total = 0;

    // The embeddings; the rotary tables they compute are kept by the first block that saves
    // them (the corpus counts each storage once, in the first unit that saves it).
    // The mask checkpointed blocks keep is likewise counted in the first of them.
    const double rotary = rotary_table_bytes(m, j, p);
    const double mask = checkpointed_mask_bytes(m, j, p);
    const double embedding = embedding_activations(m, j, e, p).saved - rotary - mask;
    const double measured_embedding = units.at("embedding").at("activation_bytes").get<double>();
    rows.push_back(row(c, "embedding", embedding, measured_embedding, skipped));
    predicted_total += embedding;
    measured_total += measured_embedding;

    bool rotary_counted = false, mask_counted = false;
    for (std::int64_t b = 0; b < m.layers; ++b) {
      const bool checkpointed = j.block_checkpointed(b);
      double predicted = block_activations(m, j, e, p, checkpointed).saved;
      // torch.utils.checkpoint keeps the block's keyword inputs (cos, sin) in its closure, out
      // of the hooks' view.
      if (!checkpointed && !rotary_counted) {
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

    // The head. The upcast path's logits are held by the model's output, not saved by autograd
    // (a fused loss saves them); a chunked loss's gradient accumulator is held by the loss
    // wrapper, and the corpus counts the largest chunk's saved tensors (its lm_head input — a
    // view of the whole hidden states when b = 1, a copy of the chunk otherwise — the fp32
    // log-probabilities and the chunk's labels).
    const auto head = head_activations(m, j, e, p);
    double predicted_head = head.saved;
    double measured_head = units.at("head").at("activation_bytes").get<double>();
    if (j.loss == LossImpl::upcast) measured_head += c.at("logits_alive_bytes").get<double>();
    if (j.loss == LossImpl::chunked) {
      const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
      const double C = T / static_cast<double>(j.loss_chunks);
      predicted_head += -e * T * h + (j.micro_batch == 1 ? e * T * h : e * C * h) + 4 * C * V + 8 * C;
    }
    rows.push_back(row(c, "head", predicted_head, measured_head, skipped));
    predicted_total += predicted_head;
    measured_total += measured_head;
    rows.push_back(row(c, "total", predicted_total, measured_total, skipped));
  }
  return rows;
}

std::vector<Row> step_rows(const nlohmann::json& corpus) {
  (void)corpus;
  return {};
}

}  // namespace shardplan::oracle
