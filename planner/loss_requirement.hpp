// What a plan asks of the user's training code beyond the recipe's own: a loss the recipe does not
// run (chosen by recommend --losses, or named with --loss). Every output of such a plan says it
// first, with the code that enables it, so that the peak it was planned for is the peak the job
// has.
#pragma once

#include <string>

#include "documents/job.hpp"

namespace shardplan::planner {

// "" when the job runs its recipe's own loss; else one sentence naming the loss, the recipe's own
// and how to switch.
std::string loss_requirement(const documents::TrainingJob& job);

}  // namespace shardplan::planner
