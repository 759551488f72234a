#include "executor/command_line.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "costmodel/input_error.hpp"

namespace shardplan::executor {

using costmodel::InputError;

CommandLine parse_command_line(int argc, const char* const* argv) {
  CLI::App app{
      "Runs a shardplan plan for real (a GPT model, real forward and backward, the plan's "
      "sharding)\n"
      "and writes what it measured: peak memory by category, step time and its parts, the\n"
      "collectives, the loss. Run it under mpirun, one rank per device; or rehearse one rank\n"
      "of an N-rank plan in one process with --rehearse-rank and --world.",
      "executor"};
  app.require_subcommand(0, 1);
  CommandLine cl;
  auto& r = cl.run;
  std::int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, intermediate = 0, vocab = 0,
               seq = 0;
  double capacity = 0;
  int rehearse = -1, world = 0;
  std::int64_t steps = 3;
  std::int64_t seed = 1234;
  app.add_option("--plan", r.plan, "plan document (planner recommend --emit plan)");
  app.add_option("--steps", steps, "optimizer steps to run [default: 3]");
  app.add_option("--out,-o", r.out, "run document to write");
  app.add_option(
      "--capacity-GiB", capacity,
      "behave like a device of this many GiB: past it, an out-of-memory error and exit code 3");
  app.add_option("--scale-layers", layers, "run the plan's model scaled down to this many blocks");
  app.add_option("--scale-hidden", hidden, "... this hidden size");
  app.add_option("--scale-heads", heads, "... this many attention heads");
  app.add_option("--scale-kv-heads", kv_heads,
                 "... this many key/value heads [default: keep the ratio]");
  app.add_option("--scale-intermediate", intermediate,
                 "... this MLP width [default: keep the ratio]");
  app.add_option("--scale-vocab", vocab, "... this vocabulary");
  app.add_option("--scale-seq", seq, "run this many tokens per sequence instead of the plan's");
  app.add_option("--seed", seed, "seed of the initial parameters and the tokens [default: 1234]");
  app.add_option("--lr", r.request.lr, "AdamW learning rate [default: 1e-3]");
  app.add_flag("--prefetch-as-planned", r.request.prefetch_as_planned,
               "issue all-gathers ahead as the plan's prefetch says, even though MPI blocks");
  app.add_option("--rehearse-rank", rehearse, "rehearse this rank of the plan in one process");
  app.add_option("--world", world, "ranks of the rehearsed run (with --rehearse-rank)");

  auto* scale = app.add_subcommand("scale-config",
                                   "write the config.json of a scaled-down model (dropout 0)");
  auto& sc = cl.scale_config;
  scale->add_option("--model", sc.model, "preset or config.json to scale")->required();
  scale->add_option("--layers", sc.size.layers, "blocks")->required();
  scale->add_option("--hidden", sc.size.hidden, "hidden size")->required();
  scale->add_option("--heads", sc.size.heads, "attention heads")->required();
  scale->add_option("--kv-heads", sc.size.kv_heads, "key/value heads [default: keep the ratio]");
  scale->add_option("--head-dim", sc.size.head_dim, "head dimension [default: hidden / heads]");
  scale->add_option("--intermediate", sc.size.intermediate, "MLP width [default: keep the ratio]");
  scale->add_option("--vocab", sc.size.vocab, "vocabulary")->required();
  scale->add_option("--max-positions", sc.size.max_positions,
                    "learned positions / context [default: the model's]");
  scale->add_option("--out,-o", sc.out, "config.json to write")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    cl.command = CommandLine::Command::help;
    cl.help_text =
        app.get_subcommands().empty() ? app.help() : app.get_subcommands().front()->help();
    return cl;
  } catch (const CLI::ParseError& e) {
    throw InputError("command line", e.what());
  }

  if (scale->parsed()) {
    cl.command = CommandLine::Command::scale_config;
    return cl;
  }
  if (r.plan.empty())
    throw InputError("--plan", "missing: the plan document to run");
  if (r.out.empty())
    throw InputError("--out", "missing: the run document to write");
  if (steps < 1 || steps > 100000)
    throw InputError("--steps", fmt::format("must be between 1 and 100000, got {}", steps));
  r.request.steps = steps;
  if (seed < 0)
    throw InputError("--seed", fmt::format("must be >= 0, got {}", seed));
  r.request.seed = static_cast<std::uint64_t>(seed);
  if (!(r.request.lr > 0 && r.request.lr < 1))
    throw InputError("--lr", fmt::format("must be in (0, 1), got {}", r.request.lr));
  if (app.count("--capacity-GiB")) {
    if (!(capacity > 0 && capacity < 1e6))
      throw InputError("--capacity-GiB", fmt::format("must be > 0, got {}", capacity));
    r.capacity_GiB = capacity;
  }
  const bool any_scale = layers || hidden || heads || kv_heads || intermediate || vocab;
  if (any_scale) {
    if (layers < 1 || hidden < 1 || heads < 1 || vocab < 1)
      throw InputError(layers < 1   ? "--scale-layers"
                       : hidden < 1 ? "--scale-hidden"
                       : heads < 1  ? "--scale-heads"
                                    : "--scale-vocab",
                       "scaling needs --scale-layers, --scale-hidden, --scale-heads and "
                       "--scale-vocab, each >= 1");
    if (kv_heads < 0 || intermediate < 0)
      throw InputError(kv_heads < 0 ? "--scale-kv-heads" : "--scale-intermediate", "must be >= 1");
    r.request.scale = ScaledSize{.layers = layers,
                                 .hidden = hidden,
                                 .heads = heads,
                                 .kv_heads = kv_heads,
                                 .intermediate = intermediate,
                                 .vocab = vocab};
  }
  if (app.count("--scale-seq")) {
    if (seq < 1)
      throw InputError("--scale-seq", fmt::format("must be >= 1, got {}", seq));
    r.request.scale_seq = seq;
  }
  const bool has_rank = app.count("--rehearse-rank") > 0, has_world = app.count("--world") > 0;
  if (has_rank != has_world)
    throw InputError(has_rank ? "--world" : "--rehearse-rank",
                     "--rehearse-rank and --world go together");
  if (has_rank) {
    if (world < 1 || world > 1'000'000)
      throw InputError("--world", fmt::format("must be >= 1, got {}", world));
    if (rehearse < 0 || rehearse >= world)
      throw InputError("--rehearse-rank",
                       fmt::format("must be in [0, {}), got {}", world, rehearse));
    r.rehearse_rank = rehearse;
    r.world = world;
  }
  return cl;
}

} // namespace shardplan::executor
