// What a plan asks of the user's training code beyond the recipe's own: a loss the recipe does not
// run (chosen by recommend --losses, or named with --loss), an FSDP mixed precision other than the
// recipe's (chosen by recommend). Every output of such a plan says it first, with the setting
// that enables it, so that the peak and step it was planned for are the job's.
#pragma once

#include <string>

#include <vector>

#include "documents/job.hpp"
#include "documents/sharding.hpp"

namespace shardplan::planner {

// "" when the job runs its recipe's own loss; else one sentence naming the loss, the recipe's own
// and how to switch.
std::string loss_requirement(const documents::TrainingJob& job);
// "" when the plan runs FSDP under the mixed precision the job named or its recipe sets; else
// one sentence naming the plan's mode and the recipe's.
std::string mixed_precision_requirement(const documents::ShardingSpec& spec,
                                        const documents::TrainingJob& job);
// Both, the ones that say something.
std::vector<std::string> plan_requirements(const documents::ShardingSpec& spec,
                                           const documents::TrainingJob& job);

}  // namespace shardplan::planner
