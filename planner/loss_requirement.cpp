#include "planner/loss_requirement.hpp"

#include <fmt/format.h>

#include "documents/recipe.hpp"

namespace shardplan::planner {

namespace {

// How each loss is switched on in the training code (the packages' own entry points).
std::string how_to_run(const documents::TrainingJob& j) {
  switch (j.loss) {
  case documents::LossImpl::fused_linear:
    return "Liger's fused linear cross-entropy (pip install liger-kernel; call "
           "liger_kernel.transformers.apply_liger_kernel_to_llama(), or the function for the "
           "model's architecture, before the model is built)";
  case documents::LossImpl::chunked:
    return fmt::format("a loss over {} chunks of the sequence (torchtitan's ChunkedLossWrapper, "
                       "num_chunks = {})",
                       j.loss_chunks, j.loss_chunks);
  case documents::LossImpl::fused:
    return "a fused cross-entropy that keeps no fp32 logits (flash-attn's CrossEntropyLoss, or "
           "the loss under torch.compile)";
  case documents::LossImpl::upcast:
    return "the model's own loss, the logits upcast to fp32";
  case documents::LossImpl::fp32_inplace:
    return "Megatron-core's in-place vocabulary-parallel cross-entropy";
  }
  return documents::loss_label(j);
}

}  // namespace

std::string loss_requirement(const documents::TrainingJob& job) {
  documents::TrainingJob own = job;
  // Under --compile the recipe's trainer compiles its loss too: the fused loss is its own.
  own.loss = job.compile ? documents::LossImpl::fused : documents::recipe_traits(job.recipe).loss;
  own.loss_chunks = job.loss_chunks;
  if (own.loss == job.loss) return "";
  return fmt::format("this plan needs the loss {}: {}, not recipe {}'s own ({}); its peak "
                     "assumes it",
                     documents::loss_label(job), how_to_run(job),
                     documents::recipe_name(job.recipe), documents::loss_label(own));
}

std::string mixed_precision_requirement(const documents::ShardingSpec& spec,
                                        const documents::TrainingJob& job) {
  const auto compute = documents::compute_dtype(job.precision);
  const auto mode = documents::fsdp_mixed_precision(spec, compute);
  const auto& recipe = documents::recipe_traits(job.recipe);
  if (!mode || job.fsdp_mixed_precision || *mode == recipe.fsdp_mixed_precision) return "";
  return fmt::format("this plan runs FSDP's mixed precision {} (--fsdp-mixed-precision {}: "
                     "parameters gathered in {}, gradients reduced in {}), not recipe {}'s {}; "
                     "its step assumes it",
                     documents::fsdp_mixed_precision_label(*mode),
                     documents::fsdp_mixed_precision_name(*mode),
                     documents::dtype_name(spec.fp32_gathered ? documents::DType::fp32 : compute),
                     documents::dtype_name(spec.reduce_dtype), recipe.name,
                     documents::fsdp_mixed_precision_label(recipe.fsdp_mixed_precision));
}

std::vector<std::string> plan_requirements(const documents::ShardingSpec& spec,
                                           const documents::TrainingJob& job) {
  std::vector<std::string> out;
  for (std::string s : {loss_requirement(job), mixed_precision_requirement(spec, job)})
    if (!s.empty()) out.push_back(std::move(s));
  return out;
}

}  // namespace shardplan::planner
