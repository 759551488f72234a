// The recipe table (documents/recipe.hpp): each row is its own recipe's, and what it offers is
// consistent with what it does by default.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "documents/recipe.hpp"

using namespace shardplan::documents;

TEST_CASE("recipe::each row describes its own recipe") {
  std::set<std::string> names;
  for (const auto& name : recipe_names()) {
    const Recipe r = recipe_from_name(name, "/recipe");
    const RecipeTraits& t = recipe_traits(r);
    INFO("recipe " << name);
    CHECK(t.recipe == r);
    CHECK(std::string(t.name) == name);
    CHECK(names.insert(name).second);
    CHECK_FALSE(t.flavours.empty());
    // What it does unless told is among what the search offers of it.
    if (t.checkpointing == Checkpointing::selective_op) CHECK(t.offers_selective_op);
    if (t.checkpointing == Checkpointing::every) CHECK(t.offers_every_n);
    // Counting the embeddings and the head as blocks is a split, which an even split refuses.
    if (t.pipeline_even_split) CHECK(t.pipeline_less_layers == 0);
    // Only a framework's own code is counted per op; the executor's engine is this project's.
    if (!t.framework) CHECK(t.saved == SavedTensors::korthikanti);
  }
  CHECK(names.size() == static_cast<std::size_t>(kRecipes));
}

TEST_CASE("recipe::every:N counts blocks as the recipe's code does") {
  // transformers' every_n_layers checkpoints layers 0, N, 2N; torchtitan 0.2's counter from 1
  // the N-th, 2N-th (documents/job.hpp, block_checkpointed).
  TrainingJob j;
  j.checkpointing = Checkpointing::every;
  j.checkpoint_every = 3;
  for (const auto& name : recipe_names()) {
    j.recipe = recipe_from_name(name, "/recipe");
    INFO("recipe " << name);
    const bool from_one = recipe_traits(j.recipe).every_n_from_one;
    CHECK(j.block_checkpointed(0) == !from_one);
    CHECK(j.block_checkpointed(2) == from_one);
    CHECK(j.block_checkpointed(3) == !from_one);
  }
}
