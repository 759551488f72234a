#include "documents/job.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "documents/recipe.hpp"

namespace shardplan::documents {

using core::InputError;
using core::ObjectReader;
using core::Range;

namespace {

template <class E>
E from_name(const std::vector<std::string>& names, const std::string& s, const std::string& where) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<E>(i);
  throw InputError(where, fmt::format("must be one of {}, got \"{}\"", fmt::join(names, ", "), s));
}

constexpr int kMaxGpus = 1'000'000;

const std::vector<std::string>& attention_names() {
  static const std::vector<std::string> n = {"flash", "eager"};
  return n;
}

}  // namespace

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> n = {"fp32", "bf16-mixed", "fp16-mixed", "bf16"};
  return n;
}
const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> n = {"adamw", "adam", "sgd", "adafactor"};
  return n;
}
const std::vector<std::string>& checkpointing_names() {
  static const std::vector<std::string> n = {"none", "full", "every", "selective-attention",
                                             "selective-op"};
  return n;
}
const std::vector<std::string>& loss_names() {
  static const std::vector<std::string> n = {"upcast", "fused", "chunked", "fused-linear",
                                             "fp32-inplace"};
  return n;
}
const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> names;
    names.reserve(kRecipes);
    for (int r = 0; r < kRecipes; ++r)
      names.emplace_back(recipe_traits(static_cast<Recipe>(r)).name);
    return names;
  }();
  return n;
}

const char* precision_name(Precision p) {
  return precision_names()[static_cast<std::size_t>(p)].c_str();
}
const char* optimizer_name(Optimizer o) {
  return optimizer_names()[static_cast<std::size_t>(o)].c_str();
}
const char* checkpointing_name(Checkpointing c) {
  return checkpointing_names()[static_cast<std::size_t>(c)].c_str();
}
const char* attention_name(AttentionImpl a) {
  return attention_names()[static_cast<std::size_t>(a)].c_str();
}

Precision precision_from_name(const std::string& s, const std::string& where) {
  return from_name<Precision>(precision_names(), s, where);
}
Optimizer optimizer_from_name(const std::string& s, const std::string& where) {
  return from_name<Optimizer>(optimizer_names(), s, where);
}
const char* loss_name(LossImpl l) { return loss_names()[static_cast<std::size_t>(l)].c_str(); }
const char* recipe_name(Recipe r) { return recipe_names()[static_cast<std::size_t>(r)].c_str(); }
Recipe recipe_from_name(const std::string& s, const std::string& where) {
  return from_name<Recipe>(recipe_names(), s, where);
}

const std::vector<std::string>& fsdp_mixed_precision_names() {
  static const std::vector<std::string> n = {"default", "pure", "full"};
  return n;
}
FsdpMixedPrecision fsdp_mixed_precision_from_name(const std::string& s, const std::string& where) {
  return from_name<FsdpMixedPrecision>(fsdp_mixed_precision_names(), s, where);
}
const char* fsdp_mixed_precision_name(FsdpMixedPrecision m) {
  return fsdp_mixed_precision_names()[static_cast<std::size_t>(m)].c_str();
}
const char* fsdp_mixed_precision_label(FsdpMixedPrecision m) {
  static const char* const labels[] = {"DEFAULT", "PURE", "FULL"};
  return labels[static_cast<std::size_t>(m)];
}

const std::vector<std::string>& fsdp2_groups_names() {
  static const std::vector<std::string> n = {"root", "ends"};
  return n;
}
Fsdp2Groups fsdp2_groups_from_name(const std::string& s, const std::string& where) {
  return from_name<Fsdp2Groups>(fsdp2_groups_names(), s, where);
}
const char* fsdp2_groups_name(Fsdp2Groups g) {
  return fsdp2_groups_names()[static_cast<std::size_t>(g)].c_str();
}

const std::vector<std::string>& float8_recipe_names() {
  static const std::vector<std::string> n = {"none", "rowwise", "rowwise_with_gw_hp"};
  return n;
}
Float8Recipe float8_recipe_from_name(const std::string& s, const std::string& where) {
  return from_name<Float8Recipe>(float8_recipe_names(), s, where);
}
const char* float8_recipe_name(Float8Recipe r) {
  return float8_recipe_names()[static_cast<std::size_t>(r)].c_str();
}

bool TrainingJob::block_checkpointed(std::int64_t b) const {
  if (checkpointing == Checkpointing::full) return true;
  if (checkpointing != Checkpointing::every) return false;
  return recipe_traits(recipe).every_n_from_one ? (b + 1) % checkpoint_every == 0
                                                : b % checkpoint_every == 0;
}

namespace {
// One of `names`; `counted` (a name among them) is written "counted:N" with N >= 1, which comes
// back as the count. `shown` lists the accepted forms for the error.
std::pair<std::size_t, std::int64_t> parse_counted(const std::string& s,
                                                   const std::vector<std::string>& names,
                                                   const std::string& counted, const char* example,
                                                   const std::vector<std::string>& shown,
                                                   const std::string& where) {
  const std::string prefix = counted + ":";
  if (s.rfind(prefix, 0) == 0) {
    const std::string digits = s.substr(prefix.size());
    const bool ok = !digits.empty() && digits.size() <= 12 &&
                    digits.find_first_not_of("0123456789") == std::string::npos &&
                    std::stoll(digits) >= 1;
    if (!ok)
      throw InputError(
          where,
          fmt::format("{}N must be a whole number >= 1 after the colon, got \"{}\"", prefix, s));
    const auto at = std::find(names.begin(), names.end(), counted) - names.begin();
    return {static_cast<std::size_t>(at), std::stoll(digits)};
  }
  if (s == counted)
    throw InputError(where, fmt::format("{} needs its count, e.g. \"{}\"", counted, example));
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return {i, 0};
  throw InputError(where, fmt::format("must be one of {}, got \"{}\"", fmt::join(shown, ", "), s));
}
}  // namespace

void set_checkpointing(TrainingJob& j, const std::string& s, const std::string& where) {
  // "selective" is the name from before the modes were told apart: Megatron's.
  const auto [index, every] = parse_counted(
      s == "selective" ? "selective-attention" : s, checkpointing_names(), "every", "every:2",
      {"none", "full", "every:N", "selective-attention", "selective", "selective-op"}, where);
  j.checkpointing = static_cast<Checkpointing>(index);
  j.checkpoint_every = every;
}

void set_loss(TrainingJob& j, const std::string& s, const std::string& where) {
  const auto [index, chunks] =
      parse_counted(s, loss_names(), "chunked", "chunked:8",
                    {"upcast", "fused", "chunked:N", "fused-linear", "fp32-inplace"}, where);
  j.loss = static_cast<LossImpl>(index);
  j.loss_chunks = chunks;
}

std::string checkpointing_label(const TrainingJob& j) {
  if (j.checkpointing == Checkpointing::every) return fmt::format("every:{}", j.checkpoint_every);
  return checkpointing_name(j.checkpointing);
}

std::string loss_label(const TrainingJob& j) {
  if (j.loss == LossImpl::chunked) return fmt::format("chunked:{}", j.loss_chunks);
  return loss_name(j.loss);
}
AttentionImpl attention_from_name(const std::string& s, const std::string& where) {
  return from_name<AttentionImpl>(attention_names(), s, where);
}

DType compute_dtype(Precision p) {
  switch (p) {
  case Precision::fp32:
    return DType::tf32;
  case Precision::fp16_mixed:
    return DType::fp16;
  case Precision::bf16_mixed:
  case Precision::bf16:
    return DType::bf16;
  }
  return DType::bf16;
}

TrainingJob job_from_json(const nlohmann::json& doc) {
  // A key is given or left out: null would be read as left out, so it is refused.
  if (doc.is_object())
    for (const auto& [key, value] : doc.items())
      if (value.is_null())
        throw InputError("/" + key, "must not be null (leave the key out for its default)");
  ObjectReader r(doc, "");
  const auto version = r.integer("schema_version");
  if (version != 1) throw InputError("/schema_version", fmt::format("must be 1, got {}", version));
  TrainingJob j;
  j.seq_len = r.integer("seq_len", Range{1, 1e8, false});
  j.global_batch = r.integer("global_batch", Range{1, 1e9, false});
  j.micro_batch = r.optional_integer("micro_batch", Range{1, 1e9, false}).value_or(0);
  if (auto p = r.optional_string("precision")) j.precision = precision_from_name(*p, "/precision");
  if (auto o = r.optional_string("optimizer")) j.optimizer = optimizer_from_name(*o, "/optimizer");
  if (auto rc = r.optional_string("recipe")) j.recipe = recipe_from_name(*rc, "/recipe");
  j.checkpointing = recipe_traits(j.recipe).checkpointing;
  if (auto c = r.optional_string("checkpointing")) set_checkpointing(j, *c, "/checkpointing");
  if (auto a = r.optional_string("attention")) j.attention = attention_from_name(*a, "/attention");
  j.loss = recipe_traits(j.recipe).loss;
  if (auto l = r.optional_string("loss")) set_loss(j, *l, "/loss");
  if (auto m = r.optional_string("fsdp_mixed_precision"))
    j.fsdp_mixed_precision = fsdp_mixed_precision_from_name(*m, "/fsdp_mixed_precision");
  j.compile = r.optional_boolean("compile").value_or(false);
  if (auto g = r.optional_string("fsdp2_groups"))
    j.fsdp2_groups = fsdp2_groups_from_name(*g, "/fsdp2_groups");
  if (auto f = r.optional_string("float8")) j.float8 = float8_recipe_from_name(*f, "/float8");
  if (const auto* filter = r.optional_array("float8_filter"))
    for (std::size_t i = 0; i < filter->size(); ++i) {
      const auto& f = (*filter)[i];
      if (!f.is_string() || f.get<std::string>().empty())
        throw InputError(fmt::format("/float8_filter/{}", i),
                         fmt::format("must be a non-empty module name, got {}", f.dump()));
      j.float8_filter.push_back(f.get<std::string>());
    }
  r.finish();
  return j;
}

nlohmann::json job_to_json(const TrainingJob& j) {
  nlohmann::json out = {{"schema_version", 1},
                        {"seq_len", j.seq_len},
                        {"global_batch", j.global_batch},
                        {"precision", precision_name(j.precision)},
                        {"optimizer", optimizer_name(j.optimizer)},
                        {"checkpointing", checkpointing_label(j)},
                        {"attention", attention_name(j.attention)},
                        {"recipe", recipe_name(j.recipe)},
                        {"loss", loss_label(j)}};
  if (j.micro_batch > 0) out["micro_batch"] = j.micro_batch;
  if (j.fsdp_mixed_precision)
    out["fsdp_mixed_precision"] = fsdp_mixed_precision_name(*j.fsdp_mixed_precision);
  if (j.compile) out["compile"] = true;
  if (j.fsdp2_groups) out["fsdp2_groups"] = fsdp2_groups_name(*j.fsdp2_groups);
  if (j.float8 != Float8Recipe::none) out["float8"] = float8_recipe_name(j.float8);
  if (!j.float8_filter.empty()) out["float8_filter"] = j.float8_filter;
  return out;
}

void validate_cluster(const Cluster& c) {
  if (c.gpus < 1 || c.gpus > kMaxGpus)
    throw InputError("--gpus", fmt::format("must be between 1 and {}, got {}", kMaxGpus, c.gpus));
  if (c.gpus_per_node < 1 || c.gpus_per_node > 1024)
    throw InputError("--gpus-per-node",
                     fmt::format("must be between 1 and 1024, got {}", c.gpus_per_node));
  if (c.gpus > c.gpus_per_node && c.gpus % c.gpus_per_node != 0) {
    const int below = c.gpus / c.gpus_per_node * c.gpus_per_node;
    const int above = below + c.gpus_per_node;  // offered only when itself allowed
    throw InputError(
        "--gpus", above <= kMaxGpus
                      ? fmt::format("{} is not a multiple of --gpus-per-node {}; {} or {} would be",
                                    c.gpus, c.gpus_per_node, below, above)
                      : fmt::format("{} is not a multiple of --gpus-per-node {}; {} would be",
                                    c.gpus, c.gpus_per_node, below));
  }
}

void validate_job(const TrainingJob& j, const Cluster& c, const std::string& global_batch_field,
                  const std::string& micro_batch_field) {
  if (j.global_batch % c.gpus != 0)
    throw InputError(global_batch_field,
                     fmt::format("{} sequences do not divide over {} GPUs; use a multiple of {}",
                                 j.global_batch, c.gpus, c.gpus));
  const auto per_gpu = j.global_batch / c.gpus;
  if (j.micro_batch > 0 && per_gpu % j.micro_batch != 0)
    throw InputError(
        micro_batch_field,
        fmt::format("{} does not divide the {} sequences per GPU (global batch {} / {} GPUs)",
                    j.micro_batch, per_gpu, j.global_batch, c.gpus));
}

}  // namespace shardplan::documents
