#include "calibrate/options.hpp"

#include <cmath>

#include <algorithm>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "calibrate/byte_size.hpp"
#include "core/input_error.hpp"
#include "core/number_text.hpp"
#include "core/version.hpp"

namespace shardplan::calibrate {
namespace {

using core::InputError;

std::string known_collectives() {
  std::vector<std::string> names;
  for (const auto& t : documents::collective_table()) names.emplace_back(t.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::vector<documents::Collective> parse_ops(const std::vector<std::string>& names,
                                             const std::string& flag) {
  std::vector<documents::Collective> ops;
  for (const auto& name : names) {
    const auto op = documents::collective_from_name(name);
    if (!op)
      throw InputError(
          flag, fmt::format("unknown collective \"{}\" (known: {})", name, known_collectives()));
    if (std::find(ops.begin(), ops.end(), *op) == ops.end()) ops.push_back(*op);
  }
  if (ops.empty()) throw InputError(flag, "names no collective");
  return ops;
}

std::uint64_t parse_size_flag(const std::string& flag, const std::string& text) {
  const auto bytes = parse_byte_size(text);
  if (!bytes)
    throw InputError(flag,
                     fmt::format("must be a byte count like 8, 64K, 32M or 1G, got \"{}\"", text));
  if (*bytes == 0) throw InputError(flag, "must be > 0, got 0");
  return *bytes;
}

// A decimal integer (core/number_text.hpp) in [min, max]; what: "an integer >= 1".
std::int64_t parse_integer_flag(const std::string& flag, const std::string& text, std::int64_t min,
                                std::int64_t max, const char* what) {
  std::int64_t value = 0;
  try {
    value = core::int64_from_text(flag, text);
  } catch (const InputError&) {
    value = min - 1;  // not a decimal integer: said as for one out of range
  }
  if (value < min || value > max)
    throw InputError(flag, fmt::format("must be {}, got \"{}\"", what, text));
  return value;
}

// A flag given as "" names nothing: refused, not read as "not given".
const std::string& named(const CLI::App& app, const std::string& flag, const std::string& text) {
  if (app.count(flag) && text.empty()) throw InputError(flag, "must name a file, got \"\"");
  return text;
}

documents::Tier parse_tier(const std::string& text) {
  if (text == "intra_node") return documents::Tier::intra_node;
  if (text == "inter_node") return documents::Tier::inter_node;
  throw InputError("--tier", fmt::format("must be intra_node or inter_node, got \"{}\"", text));
}

// The text CLI11 would print for --help of the (sub)command that asked for it.
std::string help_of(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return sub->help();
  return app.help();
}

}  // namespace

const char* backend_name(BackendKind backend) {
  return backend == BackendKind::nccl ? "nccl" : "mpi";
}

bool backend_available(BackendKind backend) {
#if defined(SHARDPLAN_HAVE_MPI)
  if (backend == BackendKind::mpi) return true;
#endif
#if defined(SHARDPLAN_HAVE_NCCL)
  if (backend == BackendKind::nccl)  // under MPI, or from torchrun's environment without it
    return true;
#endif
  (void)backend;
  return false;
}

void require_backend(BackendKind backend) {
  if (!backend_available(backend))
    throw InputError("--backend",
                     fmt::format("{}: this calibrate was built without {}", backend_name(backend),
                                 backend == BackendKind::nccl ? "CUDA and NCCL" : "MPI"));
}

namespace {

// The measure options as given: numbers are read as text and converted after parsing.
struct MeasureTexts {
  std::string backend = "mpi", ops = "all_reduce,all_gather,reduce_scatter", min_bytes, max_bytes,
              factor = "2", warmup = "5", iters = "20", groups, gemm_tokens, attention_seq;
  bool no_check = false, no_gemm = false, no_memory = false;
  std::string device_memory, timeout, fault;
  std::string
      renamed;  // the value of --device-memory-GiB, now --gpu-memory-GiB as planner names it
};

// import-nccl-tests's options as given.
struct ImportTexts {
  std::string ranks, tier, op;
};

void add_measure_options(CLI::App& app, MeasureOptions& m, MeasureTexts& t) {
  app.add_option("--backend", t.backend, "nccl (GPU buffers) or mpi (CPU buffers)")
      ->type_name("NAME")
      ->capture_default_str();
  app.add_option("--ops", t.ops, "comma list of collectives: " + known_collectives())
      ->type_name("LIST")
      ->capture_default_str();
  app.add_option("--min-bytes,-b", t.min_bytes,
                 "smallest size (nccl-tests -b; K, M, G suffixes) [default: 8]")
      ->type_name("BYTES");
  app.add_option("--max-bytes,-e", t.max_bytes,
                 "largest size (nccl-tests -e) [default: 8M for mpi, 1G for nccl]")
      ->type_name("BYTES");
  app.add_option("--factor,-f", t.factor, "size multiplier between points (nccl-tests -f)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--warmup,-w", t.warmup, "untimed runs per size (nccl-tests -w)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--iters,-n", t.iters, "timed runs per size (nccl-tests -n)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option(
         "--groups", t.groups,
         "comma list of groups: world, intra_node, inter_node (one rank per node), shard:S,\n"
         "replica:S (HSDP with shard groups of S consecutive ranks) [default: world, plus\n"
         "intra_node and inter_node when the job spans nodes]")
      ->type_name("LIST");
  app.add_flag("--no-check", t.no_check,
               "skip the correctness check of each size (nccl-tests -c 0)");
  app.add_flag("--accept-poor-fit", m.accept_poor_fit,
               "write the profile though a collective's fit misses its error goal (the planner "
               "then says so)");
  app.add_flag("--no-gemm", t.no_gemm, "skip the GEMM throughput measurement");
  app.add_flag("--no-memory", t.no_memory, "skip the memory bandwidth measurement");
  app.add_option("--gemm-model", m.gemm_model,
                 "model (preset or config.json) whose transformer-block GEMMs are timed\n"
                 "[default: gpt2 for mpi, llama-2-7b for nccl]")
      ->type_name("MODEL");
  app.add_option("--gemm-tokens", t.gemm_tokens,
                 "tokens per GEMM (its m) [default: 256 for mpi, 4096 for nccl]")
      ->type_name("N");
  app.add_option("--attention-seq", t.attention_seq,
                 "sequence length of the model's attention core, timed forward and backward over\n"
                 "sequences of that length, --gemm-tokens in all (needs --gemm-model) [default: "
                 "not timed]")
      ->type_name("N");
  app.add_option("--out,-o", m.out,
                 "profile to write [default: calibrated-<host>.json, or PROFILE with --into]")
      ->type_name("FILE");
  app.add_option("--into", m.into,
                 "existing profile to merge the calibration into: a file, or a name under\n"
                 "hardware_profiles/ as planner --hardware takes it")
      ->type_name("PROFILE");
  app.add_option("--gpu-memory-GiB", t.device_memory,
                 "the new profile's device memory (gpu.memory_GiB), the size plans must fit\n"
                 "[default: the device's; a CPU rank: the host's memory shared by its ranks]")
      ->type_name("GiB");
  app.add_option("--device-memory-GiB", t.renamed)->group("");  // renamed: refused, hidden
  app.add_option("--timeout-s", t.timeout,
                 "a rank that makes no progress for this many seconds (a peer crashed or hung) "
                 "ends the job\nwith exit code 4 [default: 300]")
      ->type_name("SECONDS");
  app.add_option("--inject-fault", t.fault,
                 "tests only: rank RANK crashes, hangs, runs out of memory or throws at sweep "
                 "point STEP\n(crash|hang|oom|throw@RANK:STEP)")
      ->type_name("FAULT");
}

CLI::App* add_import_command(CLI::App& app, ImportOptions& imp, ImportTexts& t) {
  auto* import_command = app.add_subcommand(
      "import-nccl-tests",
      "Fits the tables of nccl-tests logs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
      "...)\n"
      "and writes the calibration section: merged into --into PROFILE (written to --out or in\n"
      "place), or alone to --out (or standard output).");
  import_command->alias("import");
  import_command->add_option("logs", imp.logs, "nccl-tests output files")
      ->type_name("FILE")
      ->required();
  import_command
      ->add_option("--ranks", t.ranks, "ranks of the runs [default: from each log's rank lines]")
      ->type_name("N");
  import_command
      ->add_option("--tier", t.tier,
                   "intra_node or inter_node [default: from the hosts in each log's rank lines]")
      ->type_name("TIER");
  import_command
      ->add_option("--op", t.op,
                   "collective measured [default: from each log's header or file name]")
      ->type_name("NAME");
  import_command->add_option("--out,-o", imp.out, "file to write (-: standard output)")
      ->type_name("FILE");
  import_command
      ->add_option("--into", imp.into,
                   "existing profile to merge the calibration into: a file, or a name "
                   "under\nhardware_profiles/ as planner --hardware takes it (a shipped profile "
                   "is read-only:\nthe merged one goes to --out)")
      ->type_name("PROFILE");
  import_command->add_flag("--force", imp.force,
                           "merge logs whose rank lines name another GPU than the profile's");
  import_command->add_flag("--accept-poor-fit", imp.accept_poor_fit,
                           "write the calibration though a collective's fit misses its error "
                           "goal (the planner then says so)");
  return import_command;
}

CLI::App* add_import_overheads_command(CLI::App& app, OverheadsImportOptions& o) {
  auto* command = app.add_subcommand(
      "import-overheads",
      "Merges a framework's host-side costs measured on this host by\n"
      "validation/measure_overheads.py (torch, FSDP and DeepSpeed's own code: hooks per unit,\n"
      "per tensor and per submodule, op dispatch, DeepSpeed CPUAdam's and torch AdamW's host\n"
      "rates) into --into PROFILE (written to --out or in place).");
  command->add_option("measurement", o.measurement, "measure_overheads.py's --out file")
      ->required()
      ->type_name("FILE");
  command->add_option("--into", o.into, "existing profile to merge the overheads into")
      ->required()
      ->type_name("FILE");
  command->add_option("--out,-o", o.out, "file to write [default: --into, in place]")
      ->type_name("FILE");
  return command;
}

void read_import(const CLI::App& import_command, const ImportTexts& t, ImportOptions& imp) {
  if (import_command.count("--ranks"))
    imp.ranks = static_cast<int>(
        parse_integer_flag("--ranks", t.ranks, 1, 1'000'000, "an integer between 1 and 1000000"));
  if (import_command.count("--tier")) imp.tier = parse_tier(t.tier);
  if (import_command.count("--op")) imp.op = parse_ops({t.op}, "--op").front();
  named(import_command, "--out", imp.out);
  named(import_command, "--into", imp.into);
}

// The pieces of a comma list, empty ones included.
std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> pieces;
  for (std::size_t begin = 0; begin <= text.size();) {
    const auto comma = std::min(text.find(',', begin), text.size());
    pieces.push_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return pieces;
}

// --backend, --ops, the sweep's sizes, --warmup, --iters and --groups.
void read_sweep(const CLI::App& app, const MeasureTexts& t, MeasureOptions& m) {
  if (t.backend == "mpi")
    m.backend = BackendKind::mpi;
  else if (t.backend == "nccl")
    m.backend = BackendKind::nccl;
  else
    throw InputError("--backend", fmt::format("must be nccl or mpi, got \"{}\"", t.backend));
  m.ops = parse_ops(comma_list(t.ops), "--ops");
  const bool nccl = m.backend == BackendKind::nccl;
  m.range.min_bytes = app.count("--min-bytes") ? parse_size_flag("--min-bytes", t.min_bytes) : 8;
  m.range.max_bytes = app.count("--max-bytes") ? parse_size_flag("--max-bytes", t.max_bytes)
                                               : (nccl ? 1ULL << 30 : 8ULL << 20);
  if (m.range.min_bytes > m.range.max_bytes)
    throw InputError("--min-bytes", fmt::format("{} is larger than --max-bytes {}",
                                                format_byte_size(m.range.min_bytes),
                                                format_byte_size(m.range.max_bytes)));
  m.range.factor = static_cast<std::uint64_t>(
      parse_integer_flag("--factor", t.factor, 2, 1'000'000, "an integer >= 2 (nccl-tests -f)"));
  m.warmup = static_cast<int>(
      parse_integer_flag("--warmup", t.warmup, 0, 1'000'000, "an integer between 0 and 1000000"));
  m.iters = static_cast<int>(
      parse_integer_flag("--iters", t.iters, 1, 1'000'000, "an integer between 1 and 1000000"));
  if (app.count("--groups")) {
    for (const auto& name : comma_list(t.groups)) {
      const auto spec = comm::parse_group(name);
      if (!spec)
        throw InputError(
            "--groups", fmt::format("unknown group \"{}\" (world, intra_node, inter_node, shard:S, "
                                    "replica:S with S >= 1)",
                                    name));
      if (std::find(m.groups.begin(), m.groups.end(), *spec) == m.groups.end())
        m.groups.push_back(*spec);
    }
  }
}

// --no-check, --no-gemm, --no-memory, and the GEMM and attention shapes.
void read_compute(const CLI::App& app, const MeasureTexts& t, MeasureOptions& m) {
  const bool nccl = m.backend == BackendKind::nccl;
  m.check = !t.no_check;
  m.gemm = !t.no_gemm;
  m.memory = !t.no_memory;
  if (!app.count("--gemm-model"))
    m.gemm_model = nccl ? "llama-2-7b" : "gpt2";
  else if (m.gemm_model.empty())
    throw InputError("--gemm-model", "must name a preset or a file, got \"\"");
  m.gemm_tokens = app.count("--gemm-tokens")
                      ? parse_integer_flag("--gemm-tokens", t.gemm_tokens, 1, 1'000'000'000,
                                           "an integer between 1 and 1000000000")
                      : (nccl ? 4096 : 256);
  if (app.count("--attention-seq")) {
    m.attention_seq = parse_integer_flag("--attention-seq", t.attention_seq, 1, 1'000'000'000,
                                         "an integer between 1 and 1000000000");
    if (!app.count("--gemm-model"))
      throw InputError("--attention-seq",
                       fmt::format("{} needs --gemm-model (the model whose attention is timed)",
                                   m.attention_seq));
    // A micro-batch of whole sequences: batch = tokens / seq.
    if (m.gemm_tokens % m.attention_seq != 0)
      throw InputError("--attention-seq",
                       fmt::format("{} does not divide --gemm-tokens {} (a micro-batch of whole "
                                   "sequences)",
                                   m.attention_seq, m.gemm_tokens));
  }
}

// A number > 0 from a flag's text; what is not a decimal number is said as for one out of range.
double positive_number(const std::string& flag, const std::string& text) {
  try {
    return core::double_from_text(flag, text);
  } catch (const InputError&) {
    return 0;
  }
}

// --gpu-memory-GiB, --timeout-s and --inject-fault.
void read_limits(const CLI::App& app, const MeasureTexts& t, MeasureOptions& m) {
  if (app.count("--gpu-memory-GiB")) {
    const double gib = positive_number("--gpu-memory-GiB", t.device_memory);
    if (!(gib > 0) || !std::isfinite(gib))
      throw InputError(
          "--gpu-memory-GiB",
          fmt::format("must be a number of GiB > 0 and finite, got \"{}\"", t.device_memory));
    if (!m.into.empty())
      throw InputError("--gpu-memory-GiB",
                       fmt::format("sets a new profile's memory; --into {} keeps its own "
                                   "gpu.memory_GiB",
                                   m.into));
    m.device_memory_bytes = gib * 1073741824.0;  // GiB = 2^30 bytes
  }
  if (app.count("--timeout-s")) {
    const double seconds = positive_number("--timeout-s", t.timeout);
    if (!(seconds > 0))
      throw InputError(
          "--timeout-s",
          fmt::format("must be a number of seconds > 0 and finite, got \"{}\"", t.timeout));
    m.timeout_s = seconds;
  }
  if (app.count("--inject-fault")) {
    m.fault = comm::parse_fault_injection(t.fault);
    if (!m.fault)
      throw InputError("--inject-fault", fmt::format("expected {}, got \"{}\"",
                                                     comm::kFaultInjectionSyntax, t.fault));
  }
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  CLI::App app{"Measures this cluster's collectives (NCCL on GPUs, MPI on CPUs), GEMM throughput "
               "and memory\n"
               "bandwidth, fits the curves the cost model uses, and writes a hardware profile.\n"
               "Run it under mpirun or srun, one rank per GPU (or per CPU device); --backend "
               "nccl also runs\n"
               "without MPI: under torchrun --no-python, one process per GPU, or as one plain "
               "process (one GPU).",
               "calibrate"};
  app.set_version_flag("--version", std::string("calibrate ") + core::version(),
                       "print the program's name and version and exit");
  MeasureOptions m;
  MeasureTexts measure_texts;
  add_measure_options(app, m, measure_texts);
  ImportOptions imp;
  ImportTexts import_texts;
  auto* import_command = add_import_command(app, imp, import_texts);
  OverheadsImportOptions overheads;
  auto* overheads_command = add_import_overheads_command(app, overheads);

  CommandLine result;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    result.command = CommandLine::Command::help;
    result.help_text = help_of(app);
    return result;
  } catch (const CLI::CallForAllHelp&) {
    result.command = CommandLine::Command::help;
    result.help_text = app.help("", CLI::AppFormatMode::All);
    return result;
  } catch (const CLI::CallForVersion& e) {
    result.command = CommandLine::Command::help;  // printed as the help is
    result.help_text = std::string(e.what()) + "\n";
    return result;
  } catch (const CLI::ParseError& e) {
    throw InputError("command line", e.what());
  }

  if (import_command->parsed()) {
    result.command = CommandLine::Command::import_logs;
    read_import(*import_command, import_texts, imp);
    result.import = std::move(imp);
    return result;
  }
  if (app.count("--device-memory-GiB"))
    throw InputError("--device-memory-GiB", "renamed: give --gpu-memory-GiB");
  if (overheads_command->parsed()) {
    result.command = CommandLine::Command::import_overheads;
    named(*overheads_command, "measurement", overheads.measurement);
    named(*overheads_command, "--into", overheads.into);
    named(*overheads_command, "--out", overheads.out);
    result.overheads = std::move(overheads);
    return result;
  }
  read_sweep(app, measure_texts, m);
  read_compute(app, measure_texts, m);
  named(app, "--out", m.out);
  named(app, "--into", m.into);
  read_limits(app, measure_texts, m);
  result.measure = std::move(m);
  return result;
}

}  // namespace shardplan::calibrate
