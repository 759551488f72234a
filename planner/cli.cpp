// Over 800 lines: the commands' flags and their refusals in one place, so that the conflicts
// between flags are read together.
#include "planner/cli.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/file_writer.hpp"
#include "core/json_reader.hpp"
#include "core/number_text.hpp"
#include "core/text.hpp"
#include "core/version.hpp"
#include "documents/plan.hpp"
#include "documents/recipe.hpp"
#include "planner/deepspeed_import.hpp"
#include "planner/describe.hpp"
#include "planner/emit_deepspeed.hpp"
#include "planner/emit_fsdp.hpp"
#include "planner/emit_llm_foundry.hpp"
#include "planner/emit_parallel.hpp"
#include "planner/estimate.hpp"
#include "planner/loss_requirement.hpp"
#include "planner/parallel_estimate.hpp"
#include "planner/parallel_search.hpp"
#include "planner/recommend.hpp"
#include "planner/scenario.hpp"
#include "planner/svg_chart.hpp"
#include "planner/validate.hpp"

namespace shardplan::planner {
namespace {

using core::InputError;

void check_format(const std::string& f) {
  if (f != "table" && f != "json")
    throw InputError("--format", fmt::format("must be table or json, got \"{}\"", f));
}

// A JSON document as the planner prints it (core/text.hpp: bytes that are not UTF-8 in a path or
// name become U+FFFD).
std::string json_document(const nlohmann::json& document) {
  return core::json_text(document, 2) + "\n";
}

// Every option of every subcommand; CLI11 writes into these while parsing.
struct CliOptions {
  std::string format = "table";
  std::optional<std::string> describe_model, describe_params;
  ScenarioOptions so;
  PlanOptions po;
  ParallelOptions pa;  // estimate's tensor, pipeline and context parallelism
  std::optional<std::string> deepspeed_path;
  std::optional<nlohmann::json> deepspeed_document;  // Request::deepspeed
  std::string trace_path;
  std::optional<std::string> emit;
  std::string svg_path;
  std::optional<std::string> top;
  std::optional<std::string> losses;  // recommend --losses: other losses the search may choose
  bool exhaustive = false;
  bool model_parallel = false;  // recommend: search tensor, pipeline and context parallelism too
  bool data_parallel_only = false;  // recommend: never widen to model parallelism
  std::string strategies = "ddp,zero1,zero2,zero3,fsdp-full,fsdp-grad-op,hsdp";
  std::string plan_path, run_path;
  std::optional<std::string> validate_hardware;  // validate --hardware
  bool force = false;
  bool fsdp_as_data = false;  // Request::fsdp_as_data
  std::string retired;        // the value of a renamed flag, which is refused
};

// A flag renamed to the name the other commands use: its old spelling is refused, naming the new.
struct RenamedFlag {
  CLI::Option* old_option;
  const char* old_name;
  const char* new_name;
  const char* note;  // what else the user should know, or ""
};

struct Subcommands {
  std::vector<RenamedFlag> renamed;
  CLI::App* models;
  CLI::App* hardware;
  CLI::App* describe;
  CLI::App* estimate;
  CLI::App* simulate;
  CLI::App* recommend;
  CLI::App* compare;
  CLI::App* validate;
};

// The device memory's flag as other programs and earlier versions spelled it: refused, naming
// --gpu-memory-GiB (executor and calibrate say the same).
void add_renamed_memory_flags(CLI::App& sub, Subcommands& c, CliOptions& o) {
  for (const char* old_name : {"--device-memory-GiB", "--capacity-GiB"})
    c.renamed.push_back(
        {sub.add_option(old_name, o.retired)->group(""), old_name, "--gpu-memory-GiB", ""});
}

Subcommands add_subcommands(CLI::App& app, CliOptions& o) {
  Subcommands c{};
  c.models = app.add_subcommand("models", "list the model presets");
  c.hardware = app.add_subcommand("hardware", "list the hardware profiles");

  c.describe = app.add_subcommand("describe", "per-block parameter table of a model");
  c.describe->add_option("--model", o.describe_model, "preset name or path to a config.json");
  c.describe->add_option("--params", o.describe_params, "a bare parameter count");
  c.describe->add_option("--format", o.format, "table | json");

  c.estimate = app.add_subcommand("estimate", "memory and step time of one plan");
  add_scenario_options(*c.estimate, o.so);
  add_renamed_memory_flags(*c.estimate, c, o);
  add_plan_options(*c.estimate, o.po, false);
  c.estimate->add_option("--format", o.format, "table | json");
  c.estimate->add_option("--deepspeed", o.deepspeed_path,
                         "estimate an existing DeepSpeed config (instead of --strategy)");
  add_parallel_options(*c.estimate, o.pa);

  c.simulate = app.add_subcommand("simulate", "estimate, and write the step's timeline");
  add_scenario_options(*c.simulate, o.so);
  add_renamed_memory_flags(*c.simulate, c, o);
  add_plan_options(*c.simulate, o.po, true);
  c.simulate->add_option("--trace", o.trace_path, "Chrome-trace JSON to write (opens in Perfetto)")
      ->required();
  c.simulate->add_option("--format", o.format, "table | json");

  c.recommend = app.add_subcommand("recommend", "search the plan space and recommend a plan");
  add_scenario_options(*c.recommend, o.so);
  add_renamed_memory_flags(*c.recommend, c, o);
  add_plan_options(*c.recommend, o.po, false);
  c.recommend->add_option("--format", o.format, "table | json");
  c.recommend->add_option(
      "--emit", o.emit,
      "deepspeed | fsdp | llm-foundry | plan: print the chosen plan's config instead of the "
      "table (deepspeed, fsdp and llm-foundry search that framework's plans only); with "
      "--model-parallel: torchtitan | megatron | deepspeed | plan");
  c.recommend->add_option("--svg", o.svg_path,
                          "write the best plan of each family as stacked memory bars");
  c.recommend->add_option("--top", o.top, "ranked plans to list (default 10)");
  c.recommend->add_option(
      "--losses", o.losses,
      "comma list of losses the search may choose besides the recipe's own (fused-linear: "
      "Liger's; chunked:N; fused; upcast; fp32-inplace); a plan that needs one says so first");
  c.recommend->add_flag("--exhaustive", o.exhaustive, "simulate every plan (no pruning)");
  c.recommend->add_flag(
      "--model-parallel", o.model_parallel,
      "search tensor (with sequence), pipeline and context parallelism with DDP, ZeRO-1 and "
      "FSDP over the replicas");
  c.recommend->add_flag("--data-parallel-only", o.data_parallel_only,
                        "search data-parallel plans only, even where none can run or fit (the "
                        "search otherwise widens to model parallelism, saying so)");

  c.compare = app.add_subcommand("compare", "evaluate strategies side by side for one job");
  add_scenario_options(*c.compare, o.so);
  add_renamed_memory_flags(*c.compare, c, o);
  c.compare->add_option("--strategy", o.strategies,
                        "comma list of strategies (ddp | zero1 | zero2 | zero3 | fsdp-full | "
                        "fsdp-grad-op | hsdp) [default: all]");
  c.renamed.push_back({c.compare->add_option("--strategies", o.retired)->group(""), "--strategies",
                       "--strategy", " (a comma list, as before)"});
  c.compare->add_option("--offload", o.po.offload, "none | optimizer | params");
  c.compare->add_option("--format", o.format, "table | json");

  c.validate = app.add_subcommand("validate", "compare a plan's prediction with an executor run");
  c.validate->add_option("--plan", o.plan_path, "plan document (planner recommend --emit plan)")
      ->required();
  c.validate->add_option("--run", o.run_path, "run document written by executor --out")->required();
  c.validate->add_option("--format", o.format, "table | json");
  c.validate->add_option("--hardware", o.validate_hardware,
                         "a pipeline run: the hardware profile (preset or file) to predict its "
                         "stages with [default: the plan's, by name]");
  c.validate->add_flag("--force", o.force,
                       "compare a run of another plan anyway (said in the first line)");
  return c;
}

void run_describe(const CliOptions& o, std::ostream& out) {
  check_format(o.format);
  if (o.describe_model && o.describe_params)
    throw InputError("--params", "give either --model or --params, not both");
  if (o.describe_model && o.describe_model->empty())
    throw InputError("--model", "must name a preset or a file, got \"\"");
  const auto m = o.describe_params
                     ? documents::model_from_param_count(
                           core::double_from_text("--params", *o.describe_params))
                     : documents::load_model(o.describe_model.value_or(kDefaultModel));
  out << (o.format == "json" ? json_document(documents::model_to_json(m)) : describe_table(m));
}

// --emit llm-foundry: Composer's FSDP1 plans with FSDP1's own prefetch, what its fsdp_config
// writes (planner/emit_llm_foundry.hpp).
std::string narrow_to_composer_fsdp(const CliOptions& o, const documents::RecipeTraits& r,
                                    SearchPins& pins) {
  const auto& po = o.po;
  if (!r.runs_mpt)
    throw InputError("--emit", fmt::format("llm-foundry: recipe {} is not llm-foundry's code; plan "
                                           "with --recipe llm-foundry",
                                           r.name));
  if (pins.flavour && *pins.flavour != documents::Flavour::fsdp1)
    throw InputError("--flavour", fmt::format("--emit llm-foundry writes Composer's fsdp_config "
                                              "(FSDP1), got --flavour {}",
                                              *po.flavour));
  if (po.strategy && *po.strategy != "fsdp-full" && *po.strategy != "fsdp-grad-op" &&
      *po.strategy != "hsdp")
    throw InputError("--strategy", fmt::format("--emit llm-foundry writes Composer's fsdp_config "
                                               "(fsdp-full, fsdp-grad-op, hsdp), got --strategy {}",
                                               *po.strategy));
  pins.flavour = documents::Flavour::fsdp1;
  pins.default_prefetch = true;
  return "--emit llm-foundry: searching Composer's FSDP plans only (FSDP1 with its own prefetch, "
         "as fsdp_config runs it)";
}

// Asking for a framework's config is asking for that framework's plans: the search is narrowed
// to them. Returns the line that says so on stderr ("" when nothing was narrowed).
std::string narrow_to_emitted_framework(const CliOptions& o, const Scenario& sc, SearchPins& pins) {
  const auto& emit = o.emit;
  const auto& po = o.po;
  const documents::RecipeTraits& r = documents::recipe_traits(sc.job.recipe);
  if (emit == "deepspeed" && !r.runs_under(documents::Flavour::deepspeed))
    throw InputError("--emit",
                     fmt::format("deepspeed: recipe {} shards with {}, not DeepSpeed; use "
                                 "--emit fsdp",
                                 r.name, r.flavour_list()));
  if (emit == "fsdp" && !r.runs_under(documents::Flavour::fsdp1) &&
      !r.runs_under(documents::Flavour::fsdp2) && !r.runs_under(documents::Flavour::ddp))
    throw InputError("--emit", fmt::format("fsdp: recipe {} runs under the DeepSpeed engine; use "
                                           "--emit deepspeed",
                                           r.name));
  if (emit == "llm-foundry") return narrow_to_composer_fsdp(o, r, pins);
  if (emit == "deepspeed") {
    if (pins.flavour && *pins.flavour != documents::Flavour::deepspeed)
      throw InputError("--flavour",
                       fmt::format("--emit deepspeed writes a config for DeepSpeed's engine "
                                   "(--flavour deepspeed, stage 0 for ddp), got --flavour {}",
                                   *po.flavour));
    if (po.strategy && po.strategy->rfind("zero", 0) != 0 && *po.strategy != "ddp")
      throw InputError("--strategy",
                       fmt::format("--emit deepspeed writes a DeepSpeed config (ddp or zero1-3), "
                                   "got --strategy {}",
                                   *po.strategy));
    if (!pins.flavour) {
      pins.flavour = documents::Flavour::deepspeed;
      if (po.strategy)
        return fmt::format("--emit deepspeed: planning {} on DeepSpeed's engine (as --flavour "
                           "deepspeed)",
                           *po.strategy);
      return "--emit deepspeed: searching DeepSpeed's plans only (ZeRO stages 0-3, as "
             "--flavour deepspeed)";
    }
  } else if (emit == "fsdp") {
    if (pins.flavour == documents::Flavour::deepspeed ||
        pins.flavour == documents::Flavour::megatron)
      throw InputError(
          "--flavour",
          fmt::format("--emit fsdp writes PyTorch settings, got --flavour {}", *po.flavour));
    if (po.strategy && po.strategy->rfind("zero", 0) == 0)
      throw InputError("--strategy",
                       fmt::format("--emit fsdp writes PyTorch settings (ddp, fsdp-full, "
                                   "fsdp-grad-op, hsdp), got --strategy {}",
                                   *po.strategy));
    if (!pins.flavour && !po.strategy) {
      pins.pytorch_only = true;
      return "--emit fsdp: searching PyTorch's plans only (DDP, FSDP1, FSDP2; no DeepSpeed ZeRO)";
    }
  }
  return "";
}

// The recommend flags that shape the table or the search; refuses the combinations that would
// drop one.
void check_recommend_flags(const CliOptions& o, const CLI::App& recommend_cmd, int top_plans) {
  if (top_plans < 0) throw InputError("--top", fmt::format("must be >= 0, got {}", top_plans));
  if (o.model_parallel && o.data_parallel_only)
    throw InputError("--data-parallel-only", "give either it or --model-parallel, not both");
  const auto& emit = o.emit;
  if (o.model_parallel && emit && emit != "plan" && emit != "torchtitan" && emit != "megatron" &&
      emit != "deepspeed")
    throw InputError("--emit",
                     fmt::format("with --model-parallel must be torchtitan, megatron, deepspeed or "
                                 "plan, got \"{}\"{}",
                                 *emit,
                                 emit == "fsdp" ? " (torchtitan's options shard with FSDP2)" : ""));
  if (!o.model_parallel && (emit == "torchtitan" || emit == "megatron"))
    throw InputError("--emit", fmt::format("{} prints a layout of --model-parallel; give it, or "
                                           "--emit fsdp for a data-parallel plan",
                                           *emit));
  if (emit && emit != "plan" && emit != "deepspeed" && emit != "fsdp" && emit != "llm-foundry" &&
      emit != "torchtitan" && emit != "megatron")
    throw InputError("--emit",
                     fmt::format("must be deepspeed, fsdp, llm-foundry or plan (torchtitan or "
                                 "megatron with --model-parallel), got \"{}\"",
                                 *emit));
  // --emit prints one plan's config as the framework reads it: the table's flags would be
  // dropped.
  for (const char* flag : {"--format", "--top"})
    if (emit && recommend_cmd.count(flag))
      throw InputError(
          flag, fmt::format("shapes the table, and --emit {} prints a config instead; give one "
                            "of them",
                            *emit));
  if (recommend_cmd.count("--svg") && o.svg_path.empty())
    throw InputError("--svg", "must name a file, got \"\"");
  if (!o.svg_path.empty()) core::check_destination(o.svg_path, "--svg");
}

// The search's pins from the plan flags; the second member is the line saying the search was
// narrowed to --emit's framework ("" when it was not).
std::pair<SearchPins, std::string> search_pins(const CliOptions& o, const Scenario& sc) {
  const auto& po = o.po;
  SearchPins pins;
  pins.exhaustive = o.exhaustive;
  const auto group = shard_group_size(po);
  if (po.strategy && *po.strategy == documents::kNoWrapper)
    throw InputError("--strategy", "none (one GPU, no wrapper) is not searched; estimate it with "
                                   "planner estimate --strategy none --gpus 1");
  pins.reduce_dtype = po.reduce_dtype;
  if (po.backward_prefetch)
    pins.backward_prefetch =
        backward_prefetch_units(*po.backward_prefetch, documents::Flavour::fsdp1);
  if (po.deepspeed_optimizer)
    pins.torch_optimizer =
        torch_optimizer_from(*po.deepspeed_optimizer, documents::Flavour::deepspeed);
  if (po.strategy) {
    // Refuses an unknown strategy, and a shard group beside one that is not hsdp.
    documents::make_spec(*po.strategy, std::nullopt, sc.cluster.gpus_per_node, group);
    pins.strategy = *po.strategy;
  }
  if (po.flavour) pins.flavour = documents::flavour_from_name(*po.flavour, "--flavour");
  std::string emit_pin = narrow_to_emitted_framework(o, sc, pins);
  if (sc.job.micro_batch > 0) pins.micro_batch = sc.job.micro_batch;  // --micro-batch or the job's
  pins.checkpointing = sc.checkpointing_named;
  pins.loss = sc.loss_named;
  if (o.losses) {
    if (o.so.loss)
      throw InputError("--losses", "--loss pins the loss; give one of --loss and --losses");
    std::stringstream list(*o.losses);
    for (std::string name; std::getline(list, name, ',');) {
      documents::TrainingJob j = sc.job;
      documents::set_loss(j, name, "--losses");
      pins.other_losses.emplace_back(j.loss, j.loss_chunks);
    }
  }
  if (po.offload) pins.offload = documents::offload_from_name(*po.offload, "--offload");
  if (group) {
    if (*group < 2 || sc.cluster.gpus % *group != 0)
      throw InputError("--shard-group-size", fmt::format("must divide {} GPUs and be >= 2, got {}",
                                                         sc.cluster.gpus, *group));
    pins.shard_group_size = *group;
  }
  return {pins, emit_pin};
}

// A framework's layout config runs that framework's code: --emit torchtitan, megatron or deepspeed
// plans the recipe whose layouts it writes (RecipeTraits::layout_emit), implied where --recipe is
// not given (and said), refused where another is.
ScenarioOptions layout_emit_options(const CliOptions& o, std::vector<std::string>& notes) {
  ScenarioOptions so = o.so;
  if (!o.emit || !emitted_framework(*o.emit)) return so;
  for (int i = 0; i < documents::kRecipes; ++i) {
    const auto& r = documents::recipe_traits(static_cast<documents::Recipe>(i));
    if (*o.emit != r.layout_emit) continue;
    if (!so.recipe) {
      so.recipe = r.name;
      notes.push_back(
          fmt::format("--emit {}: planning {} (as --recipe {})", *o.emit, r.description, r.name));
    } else if (*so.recipe != r.name) {
      throw InputError("--emit", fmt::format("{}: its options run {}, but --recipe {} plans "
                                             "another code; give --recipe {} or none",
                                             *o.emit, r.description, *so.recipe, r.name));
    }
  }
  return so;
}

// recommend --model-parallel: the ranked layouts, or with --emit the fastest as the plan
// document, or the fastest a framework can express as that framework runs it.
// `why`: not empty when the search widened itself to model parallelism (said first).
void run_layout_recommend(const CliOptions& o, int top_plans, std::ostream& out,
                          std::vector<std::string>& notes, const std::string& why = "") {
  if (o.po.reduce_dtype)
    throw InputError("--reduce-dtype", fmt::format("{}: the layout search keeps each framework's "
                                                   "own reduce dtype; estimate the layout with it",
                                                   *o.po.reduce_dtype));
  if (o.po.backward_prefetch)
    throw InputError("--backward-prefetch",
                     fmt::format("{}: the layout search plans FSDP2 and the frameworks' own "
                                 "engines, not FSDP1",
                                 *o.po.backward_prefetch));
  if (o.po.deepspeed_optimizer)
    throw InputError("--deepspeed-optimizer",
                     fmt::format("{}: the layout search plans each framework's own optimizer; "
                                 "estimate the layout with it",
                                 *o.po.deepspeed_optimizer));
  const Scenario msc = make_scenario(layout_emit_options(o, notes), false);
  const auto& recipe = documents::recipe_traits(msc.job.recipe);
  if (recipe.model_parallel_dimensions().empty())
    throw InputError("--model-parallel",
                     fmt::format("the {} recipe's trainer runs no tensor, pipeline or context "
                                 "parallelism",
                                 recipe.name));
  // With --emit for a framework, the fastest plan it can run is the one kept.
  const auto framework = o.emit ? emitted_framework(*o.emit) : std::nullopt;
  const auto runs = [&](const LayoutCandidate& c) {
    return cannot_express(*framework, msc, c).empty();
  };
  const auto found =
      framework ? search_layouts(msc, 1, runs) : search_layouts(msc, o.emit ? 1 : top_plans);
  if (!o.emit) {
    // What Float8 would give, as the data-parallel recommendation says it.
    const auto fp8 = layouts_with_float8(msc, found);
    if (o.format == "json") {
      auto j = layout_search_json(msc, found, top_plans);
      if (!why.empty()) j["model_parallel_because"] = why;
      if (fp8) j["with_float8"] = evaluation_to_json(msc, *fp8);
      out << json_document(j);
    } else {
      out << (why.empty() ? "" : why + "\n") << scenario_line(msc) << "\n"
          << layout_search_table(msc, found, top_plans);
      if (fp8) out << layout_float8_line(msc, found, *fp8) << "\n";
    }
    return;
  }
  const std::string& emit = *o.emit;
  if (!msc.defaulted.empty()) notes.push_back(defaults_line(msc));
  if (found.ranked.empty())
    throw InputError("--emit", "no layout fits, so there is no plan to emit");
  if (emit == "plan") {
    out << json_document(layout_plan_document(msc, found.ranked.front()));
    return;
  }
  const auto f = *framework;
  const auto& c = expressible_layout(f, emit, msc, found, notes);
  if (f == ParallelFramework::torchtitan) {
    out << torchtitan_parallel_settings(msc, c);
  } else if (f == ParallelFramework::megatron) {
    out << megatron_parallel_arguments(msc, c);
  } else {
    if (const auto note = deepspeed_pipeline_note(msc, c); !note.empty()) notes.push_back(note);
    out << json_document(deepspeed_parallel_config(msc, c));
  }
}

// The recommendation as asked: a config to paste (what it was planned from on stderr), the JSON
// or the table, and the memory chart. `widened`: the layouts searched when no data-parallel plan
// fit and none of them did either.
void write_recommendation(const CliOptions& o, const Scenario& sc, const Recommendation& rec,
                          const std::string& emit_pin, const std::optional<LayoutSearch>& widened,
                          int top_plans, std::ostream& out, std::vector<std::string>& notes) {
  const auto& emit = o.emit;
  if (emit) {  // the config is stdout; what it was planned from goes to stderr
    if (!rec.search.ranked.empty()) {
      const auto& best = rec.search.ranked.front().eval;
      for (const auto& needs : plan_requirements(best.spec, best.job))
        notes.push_back("NOTE: " + needs);
    }
    if (!sc.defaulted.empty()) notes.push_back(defaults_line(sc));
    if (!emit_pin.empty()) notes.push_back(emit_pin);
  }
  if (emit && rec.search.ranked.empty())
    throw InputError("--emit", "no plan fits, so there is no plan to emit");
  if (!o.svg_path.empty()) {
    std::vector<Evaluation> bars;
    for (const auto& c : rec.search.best_per_family) bars.push_back(c.eval);
    core::write_file(o.svg_path, memory_svg(sc, bars), "--svg");
  }
  if (emit == "plan") {
    out << json_document(plan_document(sc, rec.search.ranked.front().eval));
  } else if (emit == "deepspeed") {
    out << json_document(deepspeed_config(sc, rec.search.ranked.front().eval));
  } else if (emit == "fsdp") {
    const auto& best = rec.search.ranked.front().eval;
    out << (o.fsdp_as_data ? json_document(fsdp_settings_json(sc, best)) : fsdp_settings(sc, best));
  } else if (emit == "llm-foundry") {
    out << llm_foundry_yaml(sc, rec.search.ranked.front().eval);
  } else if (o.format == "json") {
    auto j = recommendation_json(sc, rec, top_plans);
    if (widened)
      j["model_parallel_searched"] = {{"layouts_considered", widened->layouts},
                                      {"evaluated", widened->evaluated},
                                      {"fitting", 0}};
    out << json_document(j);
  } else {
    out << recommendation_table(sc, rec, top_plans);
    if (widened)
      out << fmt::format("{} searched too ({} layouts x strategies, {} evaluated): none fits "
                         "either\n",
                         documents::recipe_traits(sc.job.recipe).model_parallel_dimensions(),
                         widened->layouts, widened->evaluated);
  }
}

void run_recommend(const CliOptions& o, const CLI::App& recommend_cmd, std::ostream& out,
                   std::vector<std::string>& notes) {
  check_format(o.format);
  if (o.losses && o.model_parallel)
    throw InputError("--losses", "the model-parallel search keeps the recipe's loss (or --loss)");
  const int top_plans = o.top ? core::int_from_text("--top", *o.top) : 10;
  check_recommend_flags(o, recommend_cmd, top_plans);
  if (o.model_parallel) {
    run_layout_recommend(o, top_plans, out, notes);
    return;
  }
  // Data parallelism alone cannot run a global batch that does not divide over the GPUs: with no
  // data-parallel knob pinned and no config to emit, the search widens to tensor, pipeline and
  // context parallelism and says so first.
  const auto& po = o.po;
  const bool unpinned = !o.emit && !po.strategy && !po.flavour && !po.offload &&
                        !po.shard_group_size && !po.reduce_dtype && !po.backward_prefetch &&
                        !po.deepspeed_optimizer && !o.data_parallel_only;
  // The job as the layout search plans it, and the dimensions the recipe's trainer runs ("" where
  // none: nothing to widen to).
  const std::optional<Scenario> probe =
      unpinned ? std::optional(make_scenario(o.so, false)) : std::nullopt;
  const std::string dims =
      probe ? documents::recipe_traits(probe->job.recipe).model_parallel_dimensions() : "";
  if (!dims.empty()) {
    const auto gpus = static_cast<std::int64_t>(probe->cluster.gpus);
    if (probe->job.global_batch % gpus != 0) {
      run_layout_recommend(o, top_plans, out, notes,
                           fmt::format("data parallelism alone cannot run this job ({} sequences "
                                       "do not divide over {} GPUs): searching {} too, as "
                                       "--model-parallel does",
                                       probe->job.global_batch, gpus, dims));
      return;
    }
  }
  const Scenario sc = make_scenario(o.so);
  const auto [pins, emit_pin] = search_pins(o, sc);
  const auto rec = recommend(sc, pins);
  // No data-parallel plan fits: the search widens to tensor, pipeline and context parallelism
  // and says so first where a layout fits; where none does either, the data-parallel answer
  // (why nothing fits, what would) says that too.
  std::optional<LayoutSearch> widened;
  if (!dims.empty() && rec.search.ranked.empty()) {
    widened = search_layouts(*probe, 1);
    if (!widened->ranked.empty()) {
      std::optional<double> least;  // of the data-parallel plans that can run
      for (const auto& c : rec.search.best_per_family)
        if (c.eval.result.valid && (!least || c.eval.result.peak_bytes < *least))
          least = c.eval.result.peak_bytes;
      run_layout_recommend(
          o, top_plans, out, notes,
          fmt::format("no data-parallel plan fits{}: searching {} too, as --model-parallel does",
                      least ? fmt::format(" (the smallest peak is {} against {} usable)",
                                          gib(*least), gib(sc.usable_bytes()))
                            : "",
                      dims));
      return;
    }
  }
  write_recommendation(o, sc, rec, emit_pin, widened, top_plans, out, notes);
}

void run_validate(const CliOptions& o, std::ostream& out) {
  check_format(o.format);
  // The plan's errors name the plan's file; what validate refuses after it, the run's.
  const auto plan = core::read_json_document(o.plan_path, [](const nlohmann::json& d) {
    documents::plan_from_json(d);
    return d;
  });
  const auto run = core::read_json_file(o.run_path);
  std::optional<documents::HardwareProfile> hardware;
  if (o.validate_hardware) {
    if (o.validate_hardware->empty())
      throw InputError("--hardware", "must be a profile or a file, got \"\"");
    hardware = documents::load_hardware(*o.validate_hardware);
  }
  const documents::HardwareProfile* hw = hardware ? &*hardware : nullptr;
  try {
    out << (o.format == "json" ? json_document(validate_json(plan, run, o.force, hw))
                               : validate_table(plan, run, o.force, hw));
  } catch (const InputError& e) {
    throw core::error_in_file(o.run_path, e);
  }
}

void run_compare(const CliOptions& o, std::ostream& out) {
  check_format(o.format);
  const Scenario sc = make_scenario(o.so);
  std::vector<Evaluation> evals;
  if (o.strategies.empty()) throw InputError("--strategy", "names no strategy, got \"\"");
  std::stringstream list(o.strategies);
  for (std::string name; std::getline(list, name, ',');) {
    PlanOptions one = o.po;
    evals.push_back(evaluate_choosing_micro_batch(sc, make_plan_spec(one, name, sc)));
    check_countable(sc, evals.back());
  }
  if (o.format == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& e : evals) arr.push_back(evaluation_to_json(sc, e));
    out << json_document(arr);
  } else {
    compare_table(sc, evals, out);
  }
}

// estimate --deepspeed: the plan and job read from a DeepSpeed config. Sets sc.job to the
// config's job; returns the evaluation and what the import assumed.
std::pair<Evaluation, std::vector<std::string>>
evaluate_deepspeed_config(const CliOptions& o, Scenario& sc, costmodel::Trace* trace_ptr) {
  const auto& po = o.po;
  if (po.strategy)
    throw InputError("--strategy", "give either --strategy or --deepspeed, not both");
  // The config's zero_optimization (or optimizer section) says these; a flag beside it would be
  // dropped.
  for (const auto& [flag, given, section] :
       {std::tuple{"--flavour", po.flavour.has_value(), "zero_optimization"},
        std::tuple{"--offload", po.offload.has_value(), "zero_optimization"},
        std::tuple{"--reduce-dtype", po.reduce_dtype.has_value(), "zero_optimization"},
        std::tuple{"--backward-prefetch", po.backward_prefetch.has_value(), "zero_optimization"},
        std::tuple{"--deepspeed-optimizer", po.deepspeed_optimizer.has_value(),
                   "optimizer section"},
        std::tuple{"--shard-group-size", po.shard_group_size.has_value(), "zero_optimization"}})
    if (given)
      throw InputError(flag, fmt::format("give either {} or --deepspeed (its {} says it), not both",
                                         flag, section));
  // A DeepSpeed config names no model, and no default model is the user's.
  if (!o.so.model && !o.so.params && !o.so.model_document)
    throw InputError("--model",
                     "missing: a DeepSpeed config does not name the model; give --model (a "
                     "preset or a config.json) or --params");
  const auto imported =
      o.deepspeed_document
          ? import_deepspeed_config(*o.deepspeed_document, sc)
          : core::read_json_document(*o.deepspeed_path, [&](const nlohmann::json& d) {
              return import_deepspeed_config(d, sc);
            });
  sc.job = imported.job;
  auto e = imported.job.micro_batch > 0
               ? evaluate(sc, imported.spec, imported.job, trace_ptr)
               : evaluate_choosing_micro_batch(sc, imported.spec, trace_ptr);
  return {std::move(e), imported.assumptions};
}

// estimate with tensor, pipeline or context parallelism: the data-parallel strategy over what
// is left, evaluated per pipeline stage.
void run_parallel_estimate(const CliOptions& o, std::ostream& out) {
  if (o.deepspeed_path || o.deepspeed_document)
    throw InputError("--deepspeed", "give either a DeepSpeed config or model-parallel flags");
  if (!o.po.strategy)
    throw InputError("--strategy", "missing: the data-parallel strategy over the replicas");
  Scenario sc = make_scenario(o.so, false);
  const auto layout = layout_from_options(o.pa, sc);
  const auto spec = make_plan_spec(o.po, *o.po.strategy, sc);
  const Evaluation e = evaluate_layout(sc, spec, sc.job, layout);
  if (!e.result.valid)
    throw InputError(e.result.reason_input.empty() ? std::string("--strategy")
                                                   : e.result.reason_input,
                     e.result.reason);
  check_countable(sc, e);
  if (o.format == "json") {
    auto j = evaluation_to_json(sc, e);
    j["hardware_profile"] = hardware_json(sc);
    if (!sc.defaulted.empty()) j["defaulted"] = sc.defaulted;
    out << json_document(j);
    return;
  }
  if (!sc.defaulted.empty()) out << defaults_line(sc) << "\n";
  out << scenario_line(sc) << "\n" << hardware_line(sc) << "\n" << evaluation_table(sc, e);
}

// estimate, and simulate (estimate that also writes the step's timeline).
void run_estimate(const CliOptions& o, bool simulate, std::ostream& out) {
  check_format(o.format);
  if (!simulate && o.pa.given() && !o.pa.one_dimensional()) {
    run_parallel_estimate(o, out);
    return;
  }
  if (simulate) core::check_destination(o.trace_path, "--trace");
  Scenario sc = make_scenario(o.so);
  costmodel::Trace trace;
  costmodel::Trace* trace_ptr = simulate ? &trace : nullptr;
  Evaluation e;
  std::vector<std::string> assumptions;
  if (o.deepspeed_path || o.deepspeed_document) {
    std::tie(e, assumptions) = evaluate_deepspeed_config(o, sc, trace_ptr);
  } else {
    if (!o.po.strategy)
      throw InputError("--strategy", "missing (or give --deepspeed ds_config.json)");
    e = evaluate_choosing_micro_batch(sc, make_plan_spec(o.po, *o.po.strategy, sc), trace_ptr);
  }
  // The plan the user asked for cannot run as asked: bad input, never a report of zeros.
  if (!e.result.valid)
    throw InputError(o.deepspeed_path || o.deepspeed_document ? std::string("--deepspeed")
                     : e.result.reason_input.empty()          ? std::string("--strategy")
                                                              : e.result.reason_input,
                     e.result.reason);
  check_countable(sc, e);
  if (simulate)
    core::write_file(o.trace_path, core::json_text(trace_to_chrome_json(trace)) + "\n", "--trace");
  if (o.format == "json") {
    auto j = evaluation_to_json(sc, e);
    if (o.deepspeed_path || o.deepspeed_document) j["assumptions"] = assumptions;
    j["hardware_profile"] = hardware_json(sc);
    if (!sc.defaulted.empty()) j["defaulted"] = sc.defaulted;
    out << json_document(j);
  } else {
    if (!sc.defaulted.empty()) out << defaults_line(sc) << "\n";
    out << scenario_line(sc) << "\n" << hardware_line(sc) << "\n" << evaluation_table(sc, e);
    for (const auto& a : assumptions) out << "assumed: " << a << "\n";
  }
}

// Runs the parsed subcommand; its output goes to `out`, lines for stderr to `notes`.
void run_subcommand(const Subcommands& c, const CliOptions& o, std::ostream& out,
                    std::vector<std::string>& notes) {
  for (const auto& r : c.renamed)
    if (r.old_option->count() > 0)
      throw InputError(r.old_name, fmt::format("renamed: give {}{}", r.new_name, r.note));
  if (c.models->parsed()) {
    list_models(out);
  } else if (c.hardware->parsed()) {
    list_hardware(out);
  } else if (c.describe->parsed()) {
    run_describe(o, out);
  } else if (c.recommend->parsed()) {
    run_recommend(o, *c.recommend, out, notes);
  } else if (c.validate->parsed()) {
    run_validate(o, out);
  } else if (c.compare->parsed()) {
    run_compare(o, out);
  } else if (c.estimate->parsed() || c.simulate->parsed()) {
    run_estimate(o, c.simulate->parsed(), out);
  }
}

// The command line's parser, writing into `options`; run_cli and run_request share it.
struct Parser {
  CLI::App app{"shardplan planner: predicts per-GPU peak memory and step time of sharded training "
               "(DDP, ZeRO-1/2/3, FSDP, HSDP) and recommends a plan"};
  CliOptions options;
  Subcommands subcommands;
  Parser() {
    app.set_version_flag("--version", std::string("planner ") + core::version(),
                         "print the program's name and version and exit");
    app.require_subcommand(1);
    subcommands = add_subcommands(app, options);
    name_option_types(app);
  }
  Parser(const Parser&) = delete;  // app holds pointers into options
  Parser& operator=(const Parser&) = delete;
};

// "" when `first` is a flag or a command; else the one line that says so, with the command it
// most likely meant (within two letters).
std::string unknown_command(const CLI::App& app, const std::string& first) {
  if (first.empty() || first.front() == '-') return "";
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  if (std::find(names.begin(), names.end(), first) != names.end()) return "";
  const auto nearest = core::closest_name(first, names);
  return fmt::format("unknown command \"{}\"{}; the commands are {}", core::printable(first),
                     nearest ? fmt::format(" (did you mean {}?)", *nearest) : "",
                     fmt::join(names, ", "));
}

}  // namespace

Response run_request(const Request& request) {
  Parser p;
  if (!request.args.empty())
    if (const auto unknown = unknown_command(p.app, request.args.front()); !unknown.empty())
      throw InputError("command line", unknown);
  std::vector<std::string> args(request.args.rbegin(), request.args.rend());  // CLI11 pops the back
  try {
    p.app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw InputError("arguments", e.what());
  }
  p.options.so.model_document = request.model;
  p.options.so.hardware_document = request.hardware;
  if (request.deepspeed) {
    if (p.options.deepspeed_path)
      throw InputError("--deepspeed", "give either the file or the document, not both");
    if (!p.subcommands.estimate->parsed())
      throw InputError("deepspeed", "a DeepSpeed config is read by estimate only");
    p.options.deepspeed_document = request.deepspeed;
  }
  p.options.fsdp_as_data = request.fsdp_as_data;
  std::ostringstream out;
  Response r;
  run_subcommand(p.subcommands, p.options, out, r.notes);
  r.output = out.str();
  return r;
}

int run_cli(int argc, char** argv) {
  Parser p;
  CLI::App& app = p.app;
  if (argc > 1) {
    const std::string unknown = unknown_command(app, argv[1]);
    if (!unknown.empty()) {
      std::cerr << "planner: command line: " << unknown << "\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "planner: " << e.what() << "\n";
    return 2;
  }

  try {
    std::ostringstream out;
    std::vector<std::string> notes;  // for stderr, after the output
    run_subcommand(p.subcommands, p.options, out, notes);
    std::cout << out.str();
    if (!notes.empty()) {
      // Said once the output is written: a failed write is then the one line on stderr
      // (core::finish_standard_output).
      std::cout.flush();
      if (std::fflush(stdout) == 0 && !std::cout.fail())
        for (const auto& n : notes) std::cerr << "planner: " << n << "\n";
    }
    return 0;
  } catch (const InputError& e) {
    std::cerr << "planner: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "planner: internal error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace shardplan::planner
