#include "executor/command_line.hpp"

#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/input_error.hpp"
#include "core/number_text.hpp"
#include "core/option_types.hpp"
#include "core/version.hpp"

namespace shardplan::executor {

using core::InputError;

namespace {

// --save, --save-every and --resume: folders, checked before any rank starts.
void check_checkpoint_options(const CLI::App& app, const RunCommand& r, std::int64_t save_every) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto& c = r.checkpoint;
  const bool save = app.count("--save") > 0, resume = app.count("--resume") > 0;
  if (save && c.save_dir.empty()) throw InputError("--save", "must name a folder, got \"\"");
  if (save && fs::exists(c.save_dir, ec) && !fs::is_directory(c.save_dir, ec))
    throw InputError("--save", fmt::format("\"{}\" exists and is not a folder", c.save_dir));
  if (app.count("--save-every") && !save)
    throw InputError("--save-every", fmt::format("{} needs --save DIR", save_every));
  if (c.overwrite && !save) throw InputError("--overwrite", "needs --save DIR");
  if (app.count("--save-every") && (save_every < 1 || save_every > 100000))
    throw InputError("--save-every",
                     fmt::format("must be between 1 and 100000, got {}", save_every));
  if (resume && c.resume_dir.empty()) throw InputError("--resume", "must name a folder, got \"\"");
  if (resume && !fs::is_regular_file(fs::path(c.resume_dir) / "index.json", ec))
    throw InputError("--resume",
                     fmt::format("no checkpoint in \"{}\" (no index.json)", c.resume_dir));
  if (r.rehearse_rank && (save || resume))
    throw InputError(save ? "--save" : "--resume",
                     "a rehearsal holds one rank's state only: not with --rehearse-rank");
}

// The run's options as given: every number is read as text and converted after parsing
// (core/number_text.hpp): decimal only, and a value given is used or refused, never taken
// for "not given".
struct RunTexts {
  std::string layers, hidden, heads, kv_heads, intermediate, vocab, seq, capacity, rehearse, world,
      steps, seed, lr, timeout, save_every, tensor_parallel, context_parallel;
  std::string backend = "cpu";
  std::string fault;
  std::string renamed;  // the value of a renamed flag, refused
};

// Flags renamed to the names planner and scale-config use for the same thing: the old spelling
// is refused with a line naming the new one.
struct RenamedFlag {
  const char* old_name;
  const char* new_name;
};
constexpr RenamedFlag kRenamed[] = {
    {"--capacity-GiB", "--gpu-memory-GiB"}, {"--scale-layers", "--layers"},
    {"--scale-hidden", "--hidden"},         {"--scale-heads", "--heads"},
    {"--scale-kv-heads", "--kv-heads"},     {"--scale-intermediate", "--intermediate"},
    {"--scale-vocab", "--vocab"},           {"--scale-seq", "--seq-len"}};

void add_renamed(CLI::App& app, std::string& sink) {
  for (const auto& r : kRenamed) app.add_option(r.old_name, sink)->group("");  // hidden from --help
}

void refuse_renamed(const CLI::App& app) {
  for (const auto& r : kRenamed)
    if (app.count(r.old_name))
      throw InputError(r.old_name, fmt::format("renamed: give {}", r.new_name));
}

// scale-config's sizes as given (numbers as text, as RunTexts).
struct ScaleTexts {
  std::string layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, positions;
};

void add_run_options(CLI::App& app, RunCommand& r, RunTexts& t) {
  app.add_option("--plan", r.plan, "plan document (planner recommend --emit plan)");
  app.add_option("--backend", t.backend,
                 "cpu: ranks under mpirun on host memory; cuda: one GPU per rank (mpirun, "
                 "torchrun --no-python, or one process) [default: cpu]");
  app.add_option("--steps", t.steps, "optimizer steps to run [default: 3]");
  app.add_option("--out,-o", r.out, "run document to write");
  app.add_option(
      "--gpu-memory-GiB", t.capacity,
      "behave like a device of this many GiB: past it, an out-of-memory error and exit code 3\n"
      "[default: the plan's capacity/gpu_memory_GiB (planner --gpu-memory-GiB), else no limit]");
  app.add_option("--layers", t.layers, "run the plan's model scaled down to this many blocks");
  app.add_option("--hidden", t.hidden, "... this hidden size");
  app.add_option("--heads", t.heads, "... this many attention heads");
  app.add_option("--kv-heads", t.kv_heads,
                 "... this many key/value heads [default: keep the ratio]");
  app.add_option("--intermediate", t.intermediate, "... this MLP width [default: keep the ratio]");
  app.add_option("--vocab", t.vocab, "... this vocabulary");
  app.add_option("--seq-len", t.seq, "run this many tokens per sequence instead of the plan's");
  app.add_option("--seed", t.seed,
                 "seed of the initial parameters and the tokens, 0 to 2^64-1 [default: 1234]");
  app.add_option("--lr", t.lr, "AdamW learning rate [default: 1e-3]");
  app.add_flag("--prefetch-as-planned", r.request.prefetch_as_planned,
               "issue all-gathers ahead as the plan's prefetch says, even though MPI blocks");
  app.add_flag("--collective-streams", r.request.collective_streams,
               "cpu backend: run each group's collectives on a thread of its own, overlapping "
               "the compute\n(needs MPI_THREAD_MULTIPLE); the all-gathers are issued ahead as "
               "planned");
  app.add_option("--tensor-parallel", t.tensor_parallel,
                 "cpu backend: split each block's linears over this many consecutive ranks "
                 "(Megatron's\ncolumn/row-parallel), data parallelism over the rest [default: 1]");
  app.add_flag("--sequence-parallel", r.request.sequence_parallel,
               "with --tensor-parallel: norms and residuals on 1/t of the tokens");
  app.add_option("--context-parallel", t.context_parallel,
                 "cpu backend: share each sequence over this many ranks (ring attention over\n"
                 "the load-balanced split; flash attention, rotary models) [default: 1]");
  app.add_option("--rehearse-rank", t.rehearse, "rehearse this rank of the plan in one process");
  app.add_option("--world", t.world, "ranks of the rehearsed run (with --rehearse-rank)");
  app.add_option("--timeout-s", t.timeout,
                 "a rank that makes no progress for this many seconds (a peer crashed or hung) "
                 "ends the job\nwith exit code 4 [default: 300]");
  app.add_option("--inject-fault", t.fault,
                 "tests only: rank RANK crashes, hangs, runs out of memory or throws at step STEP "
                 "(crash|hang|oom|throw@RANK:STEP)");

  app.add_option("--save", r.checkpoint.save_dir,
                 "write a sharded checkpoint to this folder after the last step (checkpoint.hpp)");
  app.add_option("--save-every", t.save_every, "... and after every K-th step");
  app.add_flag("--overwrite", r.checkpoint.overwrite,
               "... even over the checkpoint of another model, plan or a later step in DIR");
  app.add_option("--resume", r.checkpoint.resume_dir,
                 "start from this checkpoint (saved by any plan on any number of ranks)");
  add_renamed(app, t.renamed);
}

CLI::App* add_scale_config(CLI::App& app, ScaleConfigCommand& sc, ScaleTexts& t) {
  auto* scale = app.add_subcommand("scale-config",
                                   "write the config.json of a scaled-down model (dropout 0)");
  scale->add_option("--model", sc.model, "preset or config.json to scale")->required();
  scale->add_option("--layers", t.layers, "blocks")->required();
  scale->add_option("--hidden", t.hidden, "hidden size")->required();
  scale->add_option("--heads", t.heads, "attention heads")->required();
  scale->add_option("--kv-heads", t.kv_heads, "key/value heads [default: keep the ratio]");
  scale->add_option("--head-dim", t.head_dim, "head dimension [default: hidden / heads]");
  scale->add_option("--intermediate", t.intermediate, "MLP width [default: keep the ratio]");
  scale->add_option("--vocab", t.vocab, "vocabulary")->required();
  scale->add_option("--max-positions", t.positions,
                    "learned positions / context [default: the model's]");
  scale->add_option("--out,-o", sc.out, "config.json to write")->required();
  return scale;
}

CLI::App* add_consolidate(CLI::App& app, ConsolidateCommand& c) {
  auto* consolidate = app.add_subcommand(
      "consolidate", "write a checkpoint's full fp32 parameters in model order (zero_to_fp32)");
  consolidate->add_option("dir", c.dir, "checkpoint folder (executor --save)")->required();
  consolidate->add_option("--out,-o", c.out, "file to write (raw little-endian fp32)")->required();
  return consolidate;
}

// A number >= 1 from a given flag's text; 0 (the library's "derive it") when not given.
std::int64_t positive_count(const CLI::App& a, const char* flag, const std::string& text) {
  if (!a.count(flag)) return 0;
  const auto v = core::int64_from_text(flag, text);
  if (v < 1) throw InputError(flag, fmt::format("must be >= 1, got {}", v));
  return v;
}

void read_scale_config(const CLI::App& scale, const ScaleTexts& t, ScaleConfigCommand& sc) {
  sc.size = ScaledSize{.layers = positive_count(scale, "--layers", t.layers),
                       .hidden = positive_count(scale, "--hidden", t.hidden),
                       .heads = positive_count(scale, "--heads", t.heads),
                       .kv_heads = positive_count(scale, "--kv-heads", t.kv_heads),
                       .head_dim = positive_count(scale, "--head-dim", t.head_dim),
                       .intermediate = positive_count(scale, "--intermediate", t.intermediate),
                       .vocab = positive_count(scale, "--vocab", t.vocab),
                       .max_positions = positive_count(scale, "--max-positions", t.positions)};
  if (sc.model.empty()) throw InputError("--model", "must name a preset or a file, got \"\"");
}

// --backend, --plan and --out.
void read_backend_and_files(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  if (t.backend == "cpu")
    r.backend = ComputeBackend::cpu;
  else if (t.backend == "cuda")
    r.backend = ComputeBackend::cuda;
  else
    throw InputError("--backend", fmt::format("must be cpu or cuda, got \"{}\"", t.backend));
  if (!app.count("--plan")) throw InputError("--plan", "missing: the plan document to run");
  if (r.plan.empty()) throw InputError("--plan", "must name a file, got \"\"");
  if (!app.count("--out")) throw InputError("--out", "missing: the run document to write");
  if (r.out.empty()) throw InputError("--out", "must name a file, got \"\"");
}

// --steps, --seed, --lr and --gpu-memory-GiB.
void read_run_numbers(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  if (app.count("--steps")) {
    const auto n = core::int64_from_text("--steps", t.steps);
    if (n < 1 || n > 100000)
      throw InputError("--steps", fmt::format("must be between 1 and 100000, got {}", n));
    r.request.steps = n;
  }
  if (app.count("--seed")) r.request.seed = core::uint64_from_text("--seed", t.seed);
  if (app.count("--lr")) {
    r.request.lr = core::double_from_text("--lr", t.lr);
    if (!(r.request.lr > 0 && r.request.lr < 1))
      throw InputError("--lr", fmt::format("must be in (0, 1), got {}", r.request.lr));
  }
  if (app.count("--gpu-memory-GiB")) {
    const double gib = core::double_from_text("--gpu-memory-GiB", t.capacity);
    if (!(gib > 0 && gib < 1e6))
      throw InputError("--gpu-memory-GiB", fmt::format("must be > 0 and < 1e6, got {}", gib));
    r.capacity_GiB = gib;
  }
}

// The model size flags (--layers, --hidden, ...) and --seq-len.
void read_scale(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  const bool any_scale = app.count("--layers") || app.count("--hidden") || app.count("--heads") ||
                         app.count("--kv-heads") || app.count("--intermediate") ||
                         app.count("--vocab");
  if (any_scale) {
    const ScaledSize size{.layers = positive_count(app, "--layers", t.layers),
                          .hidden = positive_count(app, "--hidden", t.hidden),
                          .heads = positive_count(app, "--heads", t.heads),
                          .kv_heads = positive_count(app, "--kv-heads", t.kv_heads),
                          .intermediate = positive_count(app, "--intermediate", t.intermediate),
                          .vocab = positive_count(app, "--vocab", t.vocab)};
    for (const char* flag : {"--layers", "--hidden", "--heads", "--vocab"})
      if (!app.count(flag))
        throw InputError(flag, "scaling needs --layers, --hidden, --heads and "
                               "--vocab, each >= 1");
    r.request.scale = size;
  }
  if (app.count("--seq-len")) r.request.scale_seq = positive_count(app, "--seq-len", t.seq);
}

// --rehearse-rank and --world, and --collective-streams, which a rehearsal cannot have.
void read_rehearsal(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  const bool has_rank = app.count("--rehearse-rank") > 0, has_world = app.count("--world") > 0;
  if (has_rank != has_world)
    throw InputError(has_rank ? "--world" : "--rehearse-rank",
                     "--rehearse-rank and --world go together");
  if (has_rank) {
    const auto n = core::int64_from_text("--world", t.world);
    if (n < 1 || n > 1'000'000)
      throw InputError("--world", fmt::format("must be between 1 and 1000000, got {}", n));
    const auto rank = core::int64_from_text("--rehearse-rank", t.rehearse);
    if (rank < 0 || rank >= n)
      throw InputError("--rehearse-rank", fmt::format("must be in [0, {}), got {}", n, rank));
    r.rehearse_rank = static_cast<int>(rank);
    r.world = static_cast<int>(n);
  }
  if (r.request.collective_streams && (r.backend != ComputeBackend::cpu || r.rehearse_rank))
    throw InputError("--collective-streams",
                     r.backend != ComputeBackend::cpu
                         ? "the cuda backend's collectives are on NCCL's streams already"
                         : "a rehearsal's collectives are local copies: not with --rehearse-rank");
}

// --tensor-parallel and --sequence-parallel: the cpu backend under mpirun, without checkpoints
// (a checkpoint holds whole units).
void read_tensor_parallel(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  if (app.count("--tensor-parallel")) {
    const auto n = core::int64_from_text("--tensor-parallel", t.tensor_parallel);
    if (n < 1 || n > 1024)
      throw InputError("--tensor-parallel", fmt::format("must be between 1 and 1024, got {}", n));
    r.request.tensor_parallel = static_cast<int>(n);
  }
  const int tp = r.request.tensor_parallel;
  if (r.request.sequence_parallel && tp < 2)
    throw InputError("--sequence-parallel",
                     fmt::format("needs --tensor-parallel of 2 or more, got {}", tp));
  if (tp < 2) return;
  const char* why = r.backend != ComputeBackend::cpu ? "runs on the cpu backend only"
                    : r.rehearse_rank                ? "is not rehearsed (--rehearse-rank)"
                    : !r.checkpoint.save_dir.empty() || !r.checkpoint.resume_dir.empty()
                        ? "does not write or read checkpoints (--save, --resume)"
                        : nullptr;
  if (why != nullptr)
    throw InputError("--tensor-parallel", fmt::format("{}: tensor parallelism {}", tp, why));
}

// --context-parallel: as --tensor-parallel, and not with a pipeline.
void read_context_parallel(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  if (!app.count("--context-parallel")) return;
  const auto n = core::int64_from_text("--context-parallel", t.context_parallel);
  if (n < 1 || n > 1024)
    throw InputError("--context-parallel", fmt::format("must be between 1 and 1024, got {}", n));
  r.request.context_parallel = static_cast<int>(n);
  if (n < 2) return;
  const char* why = r.backend != ComputeBackend::cpu ? "runs on the cpu backend only"
                    : r.rehearse_rank                ? "is not rehearsed (--rehearse-rank)"
                    : !r.checkpoint.save_dir.empty() || !r.checkpoint.resume_dir.empty()
                        ? "does not write or read checkpoints (--save, --resume)"
                    : app.count("--pipeline-parallel") ? "is not run with --pipeline-parallel"
                                                       : nullptr;
  if (why != nullptr)
    throw InputError("--context-parallel", fmt::format("{}: context parallelism {}", n, why));
}

// --save, --save-every, --resume, --timeout-s and --inject-fault.
void read_checkpoint_and_faults(const CLI::App& app, const RunTexts& t, RunCommand& r) {
  const std::int64_t every =
      app.count("--save-every") ? core::int64_from_text("--save-every", t.save_every) : 0;
  check_checkpoint_options(app, r, every);
  if (r.backend == ComputeBackend::cuda && (app.count("--save") || app.count("--resume")))
    throw InputError(app.count("--save") ? "--save" : "--resume",
                     "checkpoints are written and read by the cpu backend only");
  r.checkpoint.save_every = every;
  if (app.count("--timeout-s")) {
    r.timeout_s = core::double_from_text("--timeout-s", t.timeout);
    if (!(r.timeout_s > 0))
      throw InputError("--timeout-s", fmt::format("must be > 0 and finite, got {}", r.timeout_s));
  }
  if (app.count("--inject-fault")) {
    r.fault = comm::parse_fault_injection(t.fault);
    if (!r.fault)
      throw InputError("--inject-fault", fmt::format("expected {}, got \"{}\"",
                                                     comm::kFaultInjectionSyntax, t.fault));
  }
}

// What a pipeline run does not do, as the flag that asks for it (empty: nothing).
std::string pipeline_refusal(const CLI::App& app, const RunCommand& r) {
  if (r.rehearse_rank) return "--rehearse-rank";
  if (r.backend == ComputeBackend::cuda) return "--backend cuda";
  for (const char* flag : {"--save", "--resume"})
    if (app.count(flag)) return flag;
  return r.request.collective_streams ? "--collective-streams" : "";
}

// What each option's value is, as --help shows it (the options read text and check it themselves,
// so CLI11 would call every value TEXT).
void name_value_types(CLI::App& app) {
  static const core::OptionType kTypes[] = {
      {"plan", "FILE"},
      {"backend", "NAME"},
      {"steps", "INT"},
      {"out", "FILE"},
      {"gpu-memory-GiB", "GiB"},
      {"layers", "INT"},
      {"hidden", "INT"},
      {"heads", "INT"},
      {"kv-heads", "INT"},
      {"head-dim", "INT"},
      {"intermediate", "INT"},
      {"vocab", "INT"},
      {"max-positions", "INT"},
      {"seq-len", "TOKENS"},
      {"seed", "INT"},
      {"lr", "NUMBER"},
      {"tensor-parallel", "INT"},
      {"context-parallel", "INT"},
      {"rehearse-rank", "INT"},
      {"world", "INT"},
      {"timeout-s", "SECONDS"},
      {"inject-fault", "FAULT"},
      {"save", "DIR"},
      {"save-every", "INT"},
      {"resume", "DIR"},
      {"pipeline-parallel", "INT"},
      {"schedule", "NAME"},
      {"virtual-stages", "INT"},
      {"micro-batches", "INT"},
      {"model", "NAME|FILE"},
      {"dir", "DIR"},
  };
  core::name_option_types(app, std::span<const core::OptionType>(kTypes));
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  CLI::App app{
      "Runs a shardplan plan for real (a GPT model, real forward and backward, the plan's "
      "sharding)\n"
      "and writes what it measured: peak memory by category, step time and its parts, the\n"
      "collectives, the loss. Run it under mpirun, one rank per device; or rehearse one rank\n"
      "of an N-rank plan in one process with --rehearse-rank and --world.",
      "executor"};
  app.set_version_flag("--version", std::string("executor ") + core::version(),
                       "print the program's name and version and exit");
  app.require_subcommand(0, 1);
  CommandLine cl;
  auto& r = cl.run;
  RunTexts run_texts;
  ScaleTexts scale_texts;
  add_run_options(app, r, run_texts);
  PipelineTexts pipeline_texts;
  add_pipeline_options(app, pipeline_texts);
  auto* scale = add_scale_config(app, cl.scale_config, scale_texts);
  auto* consolidate = add_consolidate(app, cl.consolidate);
  name_value_types(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    cl.command = CommandLine::Command::help;
    cl.help_text =
        app.get_subcommands().empty() ? app.help() : app.get_subcommands().front()->help();
    return cl;
  } catch (const CLI::CallForVersion& e) {
    cl.command = CommandLine::Command::help;  // printed as the help is
    cl.help_text = std::string(e.what()) + "\n";
    return cl;
  } catch (const CLI::ParseError& e) {
    throw InputError("command line", e.what());
  }

  if (scale->parsed()) {
    read_scale_config(*scale, scale_texts, cl.scale_config);
    cl.command = CommandLine::Command::scale_config;
    return cl;
  }
  if (consolidate->parsed()) {
    if (cl.consolidate.out.empty()) throw InputError("--out", "must name a file, got \"\"");
    cl.command = CommandLine::Command::consolidate;
    return cl;
  }
  refuse_renamed(app);
  read_backend_and_files(app, run_texts, r);
  read_run_numbers(app, run_texts, r);
  read_scale(app, run_texts, r);
  read_rehearsal(app, run_texts, r);
  read_checkpoint_and_faults(app, run_texts, r);
  read_tensor_parallel(app, run_texts, r);
  read_context_parallel(app, run_texts, r);
  r.pipeline = read_pipeline_options(app, pipeline_texts, pipeline_refusal(app, r));
  return cl;
}

}  // namespace shardplan::executor
