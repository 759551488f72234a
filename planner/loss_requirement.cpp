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
  own.loss = documents::recipe_traits(job.recipe).loss;
  own.loss_chunks = job.loss_chunks;
  if (own.loss == job.loss) return "";
  return fmt::format("this plan needs the loss {}: {}, not recipe {}'s own ({}); its peak "
                     "assumes it",
                     documents::loss_label(job), how_to_run(job),
                     documents::recipe_name(job.recipe), documents::loss_label(own));
}

}  // namespace shardplan::planner
