#include "executor/command_line.hpp"

#include <cmath>

#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "costmodel/input_error.hpp"

namespace shardplan::executor {

using costmodel::InputError;

namespace {

// --save, --save-every and --resume: folders, checked before any rank starts.
void check_checkpoint_options(const CLI::App& app, const RunCommand& r, std::int64_t save_every) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto& c = r.checkpoint;
  const bool save = app.count("--save") > 0, resume = app.count("--resume") > 0;
  if (save && c.save_dir.empty())
    throw InputError("--save", "must name a folder, got \"\"");
  if (save && fs::exists(c.save_dir, ec) && !fs::is_directory(c.save_dir, ec))
    throw InputError("--save", fmt::format("\"{}\" exists and is not a folder", c.save_dir));
  if (app.count("--save-every") && !save)
    throw InputError("--save-every", fmt::format("{} needs --save DIR", save_every));
  if (c.overwrite && !save)
    throw InputError("--overwrite", "needs --save DIR");
  if (app.count("--save-every") && (save_every < 1 || save_every > 100000))
    throw InputError("--save-every",
                     fmt::format("must be between 1 and 100000, got {}", save_every));
  if (resume && !fs::is_regular_file(fs::path(c.resume_dir) / "index.json", ec))
    throw InputError("--resume", fmt::format("no checkpoint in \"{}\" (no index.json)",
                                             c.resume_dir));
  if (r.rehearse_rank && (save || resume))
    throw InputError(save ? "--save" : "--resume",
                     "a rehearsal holds one rank's state only: not with --rehearse-rank");
}

} // namespace

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
  std::string backend = "cpu";
  app.add_option("--backend", backend,
                 "cpu: ranks under mpirun on host memory; cuda: one GPU per rank (mpirun, "
                 "torchrun --no-python, or one process) [default: cpu]");
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
  app.add_flag("--collective-streams", r.request.collective_streams,
               "cpu backend: run each group's collectives on a thread of its own, overlapping "
               "the compute\n(needs MPI_THREAD_MULTIPLE); the all-gathers are issued ahead as "
               "planned");
  app.add_option("--rehearse-rank", rehearse, "rehearse this rank of the plan in one process");
  app.add_option("--world", world, "ranks of the rehearsed run (with --rehearse-rank)");
  std::string fault;
  app.add_option("--timeout-s", r.timeout_s,
                 "a rank that makes no progress for this many seconds (a peer crashed or hung) "
                 "ends the job\nwith exit code 4 [default: 300]");
  app.add_option("--inject-fault", fault,
                 "tests only: rank RANK crashes, hangs, runs out of memory or throws at step STEP "
                 "(crash|hang|oom|throw@RANK:STEP)");

  std::int64_t save_every = 0;
  app.add_option("--save", r.checkpoint.save_dir,
                 "write a sharded checkpoint to this folder after the last step (checkpoint.hpp)");
  app.add_option("--save-every", save_every, "... and after every K-th step");
  app.add_flag("--overwrite", r.checkpoint.overwrite,
               "... even over the checkpoint of another model, plan or a later step in DIR");
  app.add_option("--resume", r.checkpoint.resume_dir,
                 "start from this checkpoint (saved by any plan on any number of ranks)");

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

  auto* consolidate = app.add_subcommand(
      "consolidate", "write a checkpoint's full fp32 parameters in model order (zero_to_fp32)");
  consolidate->add_option("dir", cl.consolidate.dir, "checkpoint folder (executor --save)")
      ->required();
  consolidate->add_option("--out,-o", cl.consolidate.out, "file to write (raw little-endian fp32)")
      ->required();

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
  if (consolidate->parsed()) {
    if (cl.consolidate.out.empty())
      throw InputError("--out", "must name a file, got \"\"");
    cl.command = CommandLine::Command::consolidate;
    return cl;
  }
  if (backend == "cpu")
    r.backend = ComputeBackend::cpu;
  else if (backend == "cuda")
    r.backend = ComputeBackend::cuda;
  else
    throw InputError("--backend", fmt::format("must be cpu or cuda, got \"{}\"", backend));
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
  if (r.request.collective_streams && (r.backend != ComputeBackend::cpu || r.rehearse_rank))
    throw InputError("--collective-streams",
                     r.backend != ComputeBackend::cpu
                         ? "the cuda backend's collectives are on NCCL's streams already"
                         : "a rehearsal's collectives are local copies: not with --rehearse-rank");
  check_checkpoint_options(app, r, save_every);
  if (r.backend == ComputeBackend::cuda && (app.count("--save") || app.count("--resume")))
    throw InputError(app.count("--save") ? "--save" : "--resume",
                     "checkpoints are written and read by the cpu backend only");
  r.checkpoint.save_every = save_every;
  if (!(r.timeout_s > 0) || !std::isfinite(r.timeout_s))
    throw InputError("--timeout-s", fmt::format("must be > 0 and finite, got {}", r.timeout_s));
  if (app.count("--inject-fault")) {
    r.fault = comm::parse_fault_injection(fault);
    if (!r.fault)
      throw InputError("--inject-fault",
                       fmt::format("expected {}, got \"{}\"", comm::kFaultInjectionSyntax, fault));
  }
  return cl;
}

} // namespace shardplan::executor
