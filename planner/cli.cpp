#include "planner/cli.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "costmodel/json_reader.hpp"
#include "costmodel/plan.hpp"
#include "io/file_writer.hpp"
#include "io/text.hpp"
#include "costmodel/number_text.hpp"
#include "planner/deepspeed_import.hpp"
#include "planner/describe.hpp"
#include "planner/emit_deepspeed.hpp"
#include "planner/emit_fsdp.hpp"
#include "planner/estimate.hpp"
#include "planner/recommend.hpp"
#include "planner/scenario.hpp"
#include "planner/svg_chart.hpp"
#include "planner/validate.hpp"

namespace shardplan::planner {
namespace {

using costmodel::InputError;

void check_format(const std::string& f) {
  if (f != "table" && f != "json")
    throw InputError("--format", fmt::format("must be table or json, got \"{}\"", f));
}

// A JSON document as the planner prints it (io/text.hpp: bytes that are not UTF-8 in a path or
// name become U+FFFD).
std::string json_document(const nlohmann::json& document) { return io::json_text(document, 2) + "\n"; }

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"shardplan planner: predicts per-GPU peak memory and step time of sharded training "
               "(DDP, ZeRO-1/2/3, FSDP, HSDP) and recommends a plan"};
  app.set_version_flag("--version", "planner " SHARDPLAN_VERSION,
                       "print the program's name and version and exit");
  app.require_subcommand(1);
  std::string format = "table";

  auto* models = app.add_subcommand("models", "list the model presets");
  auto* hardware = app.add_subcommand("hardware", "list the hardware profiles");

  auto* describe = app.add_subcommand("describe", "per-block parameter table of a model");
  std::optional<std::string> describe_model, describe_params;
  describe->add_option("--model", describe_model, "preset name or path to a config.json");
  describe->add_option("--params", describe_params, "a bare parameter count");
  describe->add_option("--format", format, "table | json");

  ScenarioOptions so;
  PlanOptions po;
  auto* estimate = app.add_subcommand("estimate", "memory and step time of one plan");
  add_scenario_options(*estimate, so);
  add_plan_options(*estimate, po, false);
  std::optional<std::string> deepspeed_path;
  estimate->add_option("--format", format, "table | json");
  estimate->add_option("--deepspeed", deepspeed_path,
                       "estimate an existing DeepSpeed config (instead of --strategy)");

  auto* simulate = app.add_subcommand("simulate", "estimate, and write the step's timeline");
  std::string trace_path;
  add_scenario_options(*simulate, so);
  add_plan_options(*simulate, po, true);
  simulate->add_option("--trace", trace_path, "Chrome-trace JSON to write (opens in Perfetto)")->required();
  simulate->add_option("--format", format, "table | json");

  auto* recommend_cmd = app.add_subcommand("recommend", "search the plan space and recommend a plan");
  add_scenario_options(*recommend_cmd, so);
  add_plan_options(*recommend_cmd, po, false);
  std::optional<std::string> emit;
  std::string svg_path;
  std::optional<std::string> top;
  bool exhaustive = false;
  recommend_cmd->add_option("--format", format, "table | json");
  recommend_cmd->add_option("--emit", emit,
                            "deepspeed | fsdp | plan: print the chosen plan's config instead of the table "
                            "(deepspeed and fsdp search that framework's plans only)");
  recommend_cmd->add_option("--svg", svg_path, "write the best plan of each family as stacked memory bars");
  recommend_cmd->add_option("--top", top, "ranked plans to list (default 10)");
  recommend_cmd->add_flag("--exhaustive", exhaustive, "simulate every plan (no pruning)");

  auto* compare = app.add_subcommand("compare", "evaluate strategies side by side for one job");
  std::string strategies = "ddp,zero1,zero2,zero3,fsdp-full,fsdp-grad-op,hsdp";
  add_scenario_options(*compare, so);
  compare->add_option("--strategies", strategies, "comma-separated strategies");
  compare->add_option("--offload", po.offload, "none | optimizer | params");
  compare->add_option("--format", format, "table | json");

  auto* validate = app.add_subcommand("validate", "compare a plan's prediction with an executor run");
  std::string plan_path, run_path;
  validate->add_option("--plan", plan_path, "plan document (planner recommend --emit plan)")->required();
  validate->add_option("--run", run_path, "run document written by executor --out")->required();
  validate->add_option("--format", format, "table | json");
  bool force = false;
  validate->add_flag("--force", force, "compare a run of another plan anyway (said in the first line)");

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
    std::vector<std::string> notes; // for stderr, after the output
    if (models->parsed()) {
      for (const auto& n : costmodel::preset_model_names()) {
        const auto m = costmodel::load_model(n);
        out << fmt::format("{:<14} {:<20} {:>16L} params\n", n, costmodel::architecture_name(m.architecture),
                           m.total_params());
      }
    } else if (hardware->parsed()) {
      for (const auto& n : costmodel::preset_hardware_names()) {
        const auto h = costmodel::load_hardware(n);
        out << fmt::format("{:<18} {}\n", n, h.description);
      }
      out << fmt::format("(profiles in {}/hardware_profiles; a profile file's path works too)\n",
                         costmodel::data_dir());
    } else if (describe->parsed()) {
      check_format(format);
      if (describe_model && describe_params)
        throw InputError("--params", "give either --model or --params, not both");
      if (describe_model && describe_model->empty())
        throw InputError("--model", "must name a preset or a file, got \"\"");
      const auto m = describe_params
                         ? costmodel::model_from_param_count(costmodel::double_from_text("--params", *describe_params))
                         : costmodel::load_model(describe_model.value_or(kDefaultModel));
      out << (format == "json" ? json_document(costmodel::model_to_json(m)) : describe_table(m));
    } else if (recommend_cmd->parsed()) {
      check_format(format);
      const int top_plans = top ? costmodel::int_from_text("--top", *top) : 10;
      if (top_plans < 0) throw InputError("--top", fmt::format("must be >= 0, got {}", top_plans));
      if (emit && emit != "plan" && emit != "deepspeed" && emit != "fsdp")
        throw InputError("--emit", fmt::format("must be deepspeed, fsdp or plan, got \"{}\"", *emit));
      // --emit prints one plan's config as the framework reads it: the table's flags would be
      // dropped.
      for (const char* flag : {"--format", "--top"})
        if (emit && recommend_cmd->count(flag))
          throw InputError(
              flag, fmt::format("shapes the table, and --emit {} prints a config instead; give one "
                                "of them",
                                *emit));
      if (recommend_cmd->count("--svg") && svg_path.empty()) throw InputError("--svg", "must name a file, got \"\"");
      if (!svg_path.empty()) io::check_destination(svg_path, "--svg");
      const Scenario sc = make_scenario(so);
      SearchPins pins;
      pins.exhaustive = exhaustive;
      const auto group = shard_group_size(po);
      if (po.strategy) {
        // Refuses an unknown strategy, and a shard group beside one that is not hsdp.
        costmodel::make_spec(*po.strategy, std::nullopt, sc.cluster.gpus_per_node, group);
        pins.strategy = *po.strategy;
      }
      if (po.flavour) pins.flavour = costmodel::flavour_from_name(*po.flavour, "--flavour");
      // Asking for a framework's config is asking for that framework's plans: the search is
      // narrowed to them, and that is said on stderr.
      std::string emit_pin;
      if (emit == "deepspeed" && sc.job.recipe == costmodel::Recipe::torchtitan)
        throw InputError("--emit", "deepspeed: recipe torchtitan shards with FSDP2 or DDP, not "
                                   "DeepSpeed; use --emit fsdp");
      if (emit == "fsdp" && sc.job.recipe == costmodel::Recipe::deepspeed)
        throw InputError(
            "--emit",
            "fsdp: recipe deepspeed runs under the DeepSpeed engine; use --emit deepspeed");
      if (emit == "deepspeed") {
        if (pins.flavour && *pins.flavour != costmodel::Flavour::deepspeed &&
            *pins.flavour != costmodel::Flavour::ddp)
          throw InputError(
              "--flavour",
              fmt::format("--emit deepspeed writes a DeepSpeed config, got --flavour {}",
                          *po.flavour));
        if (po.strategy && po.strategy->rfind("zero", 0) != 0 && *po.strategy != "ddp")
          throw InputError(
              "--strategy",
              fmt::format("--emit deepspeed writes a DeepSpeed config (ddp or zero1-3), "
                          "got --strategy {}",
                          *po.strategy));
        if (!pins.flavour && !po.strategy) {
          pins.flavour = costmodel::Flavour::deepspeed;
          emit_pin = "--emit deepspeed: searching DeepSpeed's plans only (ZeRO stages 1-3, as "
                     "--flavour deepspeed)";
        }
      } else if (emit == "fsdp") {
        if (pins.flavour == costmodel::Flavour::deepspeed)
          throw InputError("--flavour",
                           "--emit fsdp writes PyTorch settings, got --flavour deepspeed");
        if (po.strategy && po.strategy->rfind("zero", 0) == 0)
          throw InputError("--strategy",
                           fmt::format("--emit fsdp writes PyTorch settings (ddp, fsdp-full, "
                                       "fsdp-grad-op, hsdp), got --strategy {}",
                                       *po.strategy));
        if (!pins.flavour && !po.strategy) {
          pins.pytorch_only = true;
          emit_pin =
              "--emit fsdp: searching PyTorch's plans only (DDP, FSDP1, FSDP2; no DeepSpeed ZeRO)";
        }
      }
      if (sc.job.micro_batch > 0) pins.micro_batch = sc.job.micro_batch;  // --micro-batch or the job's
      pins.checkpointing = sc.checkpointing_named;
      pins.loss = sc.loss_named;
      if (po.offload) pins.offload = costmodel::offload_from_name(*po.offload, "--offload");
      if (group) {
        if (*group < 2 || sc.cluster.gpus % *group != 0)
          throw InputError("--shard-group-size", fmt::format("must divide {} GPUs and be >= 2, got {}",
                                                             sc.cluster.gpus, *group));
        pins.shard_group_size = *group;
      }
      const auto rec = recommend(sc, pins);
      if (emit) { // the config is stdout; what it was planned from goes to stderr
        if (!sc.defaulted.empty()) notes.push_back(defaults_line(sc));
        if (!emit_pin.empty()) notes.push_back(emit_pin);
      }
      if (emit && rec.search.ranked.empty())
        throw InputError("--emit", "no plan fits, so there is no plan to emit");
      if (!svg_path.empty()) {
        std::vector<Evaluation> bars;
        for (const auto& c : rec.search.best_per_family) bars.push_back(c.eval);
        io::write_file(svg_path, memory_svg(sc, bars), "--svg");
      }
      if (emit == "plan") {
        out << json_document(plan_document(sc, rec.search.ranked.front().eval));
      } else if (emit == "deepspeed") {
        out << json_document(deepspeed_config(sc, rec.search.ranked.front().eval));
      } else if (emit == "fsdp") {
        out << fsdp_settings(sc, rec.search.ranked.front().eval);
      } else if (format == "json") {
        out << json_document(recommendation_json(sc, rec, top_plans));
      } else {
        out << recommendation_table(sc, rec, top_plans);
      }
    } else if (validate->parsed()) {
      check_format(format);
      // The plan's errors name the plan's file; what validate refuses after it, the run's.
      const auto plan = costmodel::read_json_document(plan_path, [](const nlohmann::json& d) {
        costmodel::plan_from_json(d);
        return d;
      });
      const auto run = costmodel::read_json_file(run_path);
      try {
        out << (format == "json" ? json_document(validate_json(plan, run, force)) : validate_table(plan, run, force));
      } catch (const InputError& e) {
        throw costmodel::error_in_file(run_path, e);
      }
    } else if (compare->parsed()) {
      check_format(format);
      const Scenario sc = make_scenario(so);
      std::vector<Evaluation> evals;
      if (strategies.empty()) throw InputError("--strategies", "names no strategy, got \"\"");
      std::stringstream list(strategies);
      for (std::string name; std::getline(list, name, ',');) {
        PlanOptions one = po;
        evals.push_back(evaluate_choosing_micro_batch(sc, make_plan_spec(one, name, sc)));
        check_countable(sc, evals.back());
      }
      if (format == "json") {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& e : evals) arr.push_back(evaluation_to_json(sc, e));
        out << json_document(arr);
      } else {
        if (!sc.defaulted.empty())
          out << defaults_line(sc) << "\n";
        out << scenario_line(sc) << "\n" << hardware_line(sc) << "\n";
        out << fmt::format("{:<14} {:<10} {:>5} {:>11} {:>11} {:>11} {:>10} {:>11} {:>7}  {}\n", "strategy",
                           "flavour", "mb", "states GiB", "peak GiB", "step s", "exposed s", "tokens/s", "MFU",
                           "verdict");
        for (const auto& e : evals) {
          const auto& r = e.result;
          if (!r.valid) {
            out << fmt::format("{:<14} {:<10} not runnable: {}\n", e.spec.strategy,
                               costmodel::flavour_name(e.spec.flavour), r.reason);
            continue;
          }
          out << fmt::format("{:<14} {:<10} {:>5} {:>11.2f} {:>11.2f} {:>11.3f} {:>10.3f} {:>11.0f} {:>6.1f}%  {}\n",
                             e.spec.strategy, costmodel::flavour_name(e.spec.flavour), e.job.micro_batch,
                             costmodel::total(r.model_states) / (1 << 30), r.peak_bytes / (1 << 30), r.step_s,
                             r.exposed_comm_s, r.tokens_per_s, 100 * r.mfu, e.fits ? "fits" : "DOES NOT FIT");
        }
      }
    } else if (estimate->parsed() || simulate->parsed()) {
      check_format(format);
      if (simulate->parsed()) io::check_destination(trace_path, "--trace");
      Scenario sc = make_scenario(so);
      costmodel::Trace trace;
      costmodel::Trace* trace_ptr = simulate->parsed() ? &trace : nullptr;
      Evaluation e;
      std::vector<std::string> assumptions;
      if (deepspeed_path) {
        if (po.strategy)
          throw InputError("--strategy", "give either --strategy or --deepspeed, not both");
        // The config's zero_optimization says these; a flag beside it would be dropped.
        for (const auto& [flag, given] :
             {std::pair{"--flavour", po.flavour.has_value()},
              std::pair{"--offload", po.offload.has_value()},
              std::pair{"--shard-group-size", po.shard_group_size.has_value()}})
          if (given)
            throw InputError(
                flag, fmt::format("give either {} or --deepspeed (its zero_optimization says it), "
                                  "not both",
                                  flag));
        // A DeepSpeed config names no model, and no default model is the user's.
        if (!so.model && !so.params)
          throw InputError("--model",
                           "missing: a DeepSpeed config does not name the model; give --model (a "
                           "preset or a config.json) or --params");
        const auto imported = costmodel::read_json_document(
            *deepspeed_path, [&](const nlohmann::json& d) { return import_deepspeed_config(d, sc); });
        assumptions = imported.assumptions;
        sc.job = imported.job;
        e = imported.job.micro_batch > 0 ? evaluate(sc, imported.spec, imported.job, trace_ptr)
                                         : evaluate_choosing_micro_batch(sc, imported.spec, trace_ptr);
      } else {
        if (!po.strategy) throw InputError("--strategy", "missing (or give --deepspeed ds_config.json)");
        e = evaluate_choosing_micro_batch(sc, make_plan_spec(po, *po.strategy, sc), trace_ptr);
      }
      check_countable(sc, e);
      if (simulate->parsed())
        io::write_file(trace_path, io::json_text(trace_to_chrome_json(trace)) + "\n", "--trace");
      if (format == "json") {
        auto j = evaluation_to_json(sc, e);
        if (deepspeed_path) j["assumptions"] = assumptions;
        j["hardware_profile"] = hardware_json(sc);
        if (!sc.defaulted.empty())
          j["defaulted"] = sc.defaulted;
        out << json_document(j);
      } else {
        if (!sc.defaulted.empty())
          out << defaults_line(sc) << "\n";
        out << scenario_line(sc) << "\n" << hardware_line(sc) << "\n" << evaluation_table(sc, e);
        for (const auto& a : assumptions) out << "assumed: " << a << "\n";
      }
    }
    std::cout << out.str();
    if (!notes.empty()) {
      // Said once the output is written: a failed write is then the one line on stderr
      // (io::finish_standard_output).
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
