#include "calibrate/measure_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "calibrate/attention_bench.hpp"
#include "calibrate/byte_size.hpp"
#include "calibrate/collective_bench.hpp"
#include "calibrate/compute_calibration.hpp"
#include "calibrate/elementwise_bench.hpp"
#include "calibrate/group_plan.hpp"
#include "calibrate/host_info.hpp"
#include "calibrate/profile_writer.hpp"
#include "calibrate/results_table.hpp"
#include "comm/comm_error.hpp"
#include "comm/fault_injection.hpp"
#include "comm/groups.hpp"
#include "comm/launch_env.hpp"
#include "comm/process_identity.hpp"
#include "comm/topology.hpp"
#include "comm/watchdog.hpp"
#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/text.hpp"
#include "documents/model.hpp"

#if defined(SHARDPLAN_HAVE_MPI)
#include "comm/mpi_environment.hpp"
#endif
#if defined(SHARDPLAN_HAVE_NCCL)
#include "calibrate/staged_host_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#endif

namespace shardplan::calibrate {
namespace {

using core::InputError;
using nlohmann::json;

// What rank 0 checks before anything is measured, so that a bad flag or file costs no sweep.
// clang-tidy 14 says its (noexcept) default constructor may throw: it follows nlohmann::json's
// noexcept default constructor into json_value(value_t), to a throw that null never reaches
// (llvm/llvm-project#54956: the analysis does not stop at noexcept).
struct Preflight {  // NOLINT(bugprone-exception-escape)
  std::string out_path;
  std::string out_flag;   // the flag that named out_path: --out, or --into (written in place)
  std::string into_path;  // --into's file (a profile's name resolved through the data dir)
  json into_profile;
  std::vector<GemmShape> model_shapes;
  std::vector<documents::ElementwiseOp> elementwise_ops;  // the model's, with their counts
  std::int64_t head_dim = 1;
  documents::AttentionShape attention;  // --attention-seq's core; batch 0: none
};

Preflight preflight(const MeasureOptions& o, const comm::Topology& topology) {
  Preflight p;
  if (!o.into.empty()) {
    p.into_path = into_profile_path(o.into);
    p.into_profile = read_profile_for_merge(p.into_path);
  } else if (!o.gemm || !o.memory) {
    throw InputError(o.gemm ? "--no-memory" : "--no-gemm",
                     "a new profile needs the GEMM and memory measurements (its peak, efficiency "
                     "and bandwidth); "
                     "skip them only with --into PROFILE");
  }
  p.out_path = !o.into.empty()  ? merge_destination(p.into_path, o.out)
               : !o.out.empty() ? o.out
                                : fmt::format("calibrated-{}.json", topology.hosts.front());
  p.out_flag = o.out.empty() && !o.into.empty() ? "--into" : "--out";
  core::check_destination(p.out_path, p.out_flag);
  if (o.gemm || o.attention_seq > 0) {
    try {
      const auto model = documents::load_model(o.gemm_model);
      p.model_shapes = model_gemm_shapes(model, o.gemm_tokens);
      p.elementwise_ops = model_elementwise_ops(model);
      p.head_dim = std::max<std::int64_t>(1, model.head_dim);
      if (o.attention_seq > 0)
        p.attention = model_attention_shape(model, o.gemm_tokens, o.attention_seq);
    } catch (const InputError& e) {
      const std::string what = e.what();  // "<where>: <message>"; the flag replaces the where
      throw InputError("--gemm-model", what.substr(std::min(what.size(), e.where().size() + 2)));
    }
  }
  return p;
}

// Rank 0's verdict reaches every rank; the shapes travel as int64 triples.
bool share_preflight(comm::Communicator& world, const std::optional<std::string>& error,
                     Preflight& pre) {
  std::int32_t failed = error.has_value() ? 1 : 0;
  world.broadcast(&failed, 1, comm::DataType::i32, 0);
  if (failed) return false;
  // The GEMM shapes (m, n, k, count), then the element-wise layers (kind, width, count), the
  // head dimension and the attention core: other ranks may not see the model's file.
  auto& shapes = pre.model_shapes;
  auto& core = pre.attention;
  std::int64_t sizes[8] = {static_cast<std::int64_t>(shapes.size()),
                           static_cast<std::int64_t>(pre.elementwise_ops.size()),
                           pre.head_dim,
                           core.batch,
                           core.seq,
                           core.heads,
                           core.kv_heads,
                           core.head_dim};
  world.broadcast(sizes, 8, comm::DataType::i64, 0);
  core = {sizes[3], sizes[4], sizes[5], sizes[6], sizes[7]};
  std::vector<std::int64_t> flat(static_cast<std::size_t>(sizes[0]) * 4);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    flat[4 * i] = shapes[i].m;
    flat[4 * i + 1] = shapes[i].n;
    flat[4 * i + 2] = shapes[i].k;
    flat[4 * i + 3] = shapes[i].count;
  }
  world.broadcast(flat.data(), flat.size(), comm::DataType::i64, 0);
  shapes.clear();
  for (std::size_t i = 0; i < flat.size(); i += 4)
    shapes.push_back({flat[i], flat[i + 1], flat[i + 2], flat[i + 3]});
  std::vector<double> ops(static_cast<std::size_t>(sizes[1]) * 3);
  for (std::size_t i = 0; i < pre.elementwise_ops.size(); ++i) {
    ops[3 * i] = static_cast<double>(pre.elementwise_ops[i].kind);
    ops[3 * i + 1] = pre.elementwise_ops[i].width;
    ops[3 * i + 2] = pre.elementwise_ops[i].count;
  }
  world.broadcast(ops.data(), ops.size(), comm::DataType::f64, 0);
  pre.elementwise_ops.clear();
  for (std::size_t i = 0; i < ops.size(); i += 3)
    pre.elementwise_ops.push_back(
        {static_cast<documents::ElementwiseKind>(static_cast<int>(ops[i])), ops[i + 1],
         ops[i + 2]});
  pre.head_dim = sizes[2];
  return true;
}

// The communicator the sweeps measure, opened once the topology is known. Collective over the
// host world.
using OpenBackend = std::function<std::unique_ptr<comm::Communicator>(const comm::Topology&)>;

json sweep_extra(const MeasureOptions& o, const GroupPlan& plan) {
  json groups = json::array();
  for (const auto& g : plan.groups)
    groups.push_back({{"name", g.name},
                      {"ranks", g.ranks},
                      {"groups", g.groups},
                      {"tier", documents::tier_name(g.tier)}});
  return {{"min_bytes", o.range.min_bytes},
          {"max_bytes", o.range.max_bytes},
          {"factor", o.range.factor},
          {"warmup", o.warmup},
          {"iters", o.iters},
          {"data_type", "float"},
          {"time", "median of 5 timed batches of the iters, each the slowest rank's mean per call"},
          {"groups", groups},
          {"notes", plan.notes}};
}

// The compute figures for the calibration section and, for a new profile, the system.
void add_compute(const MeasureOptions& o, const ComputeCalibration& c, const Preflight& pre,
                 const comm::Topology& topology, CalibrationRecord& record,
                 MeasuredSystem& system) {
  record.gemm = c.gemm;
  record.memory_bandwidth_Bps = c.memory_bandwidth_Bps;
  record.elementwise_elems_per_s = c.elementwise_elems_per_s;
  record.attention = c.attention;
  record.straggler_wait = c.straggler_wait;
  json& extra = record.extra;
  const double model_rate = model_gemm_rate(c.gemm, c.model_dtype);
  json peaks = json::object();
  for (auto d : {documents::DType::fp32, documents::DType::tf32, documents::DType::bf16,
                 documents::DType::fp16}) {
    const double best = best_gemm_rate(c.gemm, d);
    if (best > 0) {
      system.peak_flops[d] = best;
      peaks[documents::dtype_name(d)] = rounded(best / 1e12, 4);
    }
  }
  if (o.gemm) {
    extra["gemm_model"] = o.gemm_model;
    extra["gemm_tokens"] = o.gemm_tokens;
    extra["gemm_best_TFLOPs"] = peaks;
    extra["gemm_model_shapes_TFLOPs"] = rounded(model_rate / 1e12, 4);
    const double best = best_gemm_rate(c.gemm, c.model_dtype);
    system.compute_efficiency = best > 0 ? model_rate / best : 0;
    if (pre.into_profile.is_null()) {
      record.compute_efficiency = system.compute_efficiency;
      extra["compute_efficiency_reference"] =
          fmt::format("best measured {} GEMM rate", documents::dtype_name(c.model_dtype));
    } else {
      // Against the profile's own peak, which the cost model multiplies it with.
      const auto profile = documents::hardware_from_json(pre.into_profile, "into");
      const double peak = profile.peak(c.model_dtype);
      const double ratio = peak > 0 ? model_rate / peak : 0;
      record.compute_efficiency = std::min(1.0, ratio);
      extra["compute_efficiency_reference"] = fmt::format(
          "the profile's {} peak, {} TFLOP/s", documents::dtype_name(c.model_dtype), peak / 1e12);
      if (ratio > 1) extra["compute_efficiency_unclamped"] = rounded(ratio, 3);
    }
  }
  system.device = c.device;
  system.cpu_device = c.cpu_device;
  system.efficiency_dtype = c.model_dtype;
  system.ranks_per_node = topology.local_size;
  const double host_memory = comm::host_memory_bytes().value_or(0);
  system.host_memory_bytes = host_memory;
  if (c.cpu_device) {
    system.device_memory_bytes = host_memory / topology.local_size;
    system.device_memory_note =
        fmt::format("the host's MemTotal shared by its {} ranks", topology.local_size);
    system.host_link_Bps = c.memory_bandwidth_Bps.value_or(0);
    system.host_link_note = "a CPU device shares host memory: the measured copy bandwidth";
  } else {
    system.device_memory_bytes = c.device_memory_bytes.value_or(0);
    system.device_memory_note = "cudaGetDeviceProperties totalGlobalMem";
    system.host_link_Bps = c.host_link_Bps.value_or(0);
    system.host_link_note = "pinned host-to-device cudaMemcpyAsync, slowest rank";
  }
  if (o.device_memory_bytes) {
    system.device_memory_bytes = *o.device_memory_bytes;
    system.device_memory_note = "set with --gpu-memory-GiB";
  }
  system.memory_bandwidth_Bps = c.memory_bandwidth_Bps.value_or(0);
  if (c.optimizer_params_per_s) {
    system.optimizer_params_per_s = *c.optimizer_params_per_s * topology.local_size;
    extra["optimizer_Gparams_per_s_per_rank"] = rounded(*c.optimizer_params_per_s / 1e9, 4);
  }
  if (c.host_link_Bps) extra["host_to_device_GBps"] = rounded(*c.host_link_Bps / 1e9, 4);
}

// The group plan and the root's preflight, the same verdict on every rank. False (after the
// root printed the error) when the options or files are refused.
bool check_options(const MeasureOptions& o, comm::Communicator& host_world,
                   const comm::Topology& topology, std::ostream& err, GroupPlan& plan,
                   Preflight& pre) {
  const bool root = host_world.rank() == 0;
  std::optional<std::string> error;
  try {
    plan = plan_groups(o.groups, topology);  // the same verdict on every rank
    if (o.fault && o.fault->rank >= topology.size)
      throw InputError("--inject-fault", fmt::format("rank {} is not one of the job's {} ranks",
                                                     o.fault->rank, topology.size));
    if (root) pre = preflight(o, topology);
  } catch (const InputError& e) {
    error = e.what();
  }
  if (!share_preflight(host_world, error, pre)) {
    if (root) fmt::print(err, "calibrate: {}\n", *error);
    return false;
  }
  return true;
}

void print_header(std::ostream& out, const MeasureOptions& o, const comm::Topology& topology,
                  const std::string& library, const GroupPlan& plan) {
  fmt::print(out,
             "# calibrate: {} backend ({}), {} ranks on {} node{} ({}), float, warmup {}, iters "
             "{}, sizes {} .. {} x{}\n",
             backend_name(o.backend), library, topology.size, topology.nodes,
             topology.nodes == 1 ? "" : "s", topology.host_list(), o.warmup, o.iters,
             human_bytes(static_cast<double>(o.range.min_bytes)),
             human_bytes(static_cast<double>(o.range.max_bytes)), o.range.factor);
  for (const auto& note : plan.notes) fmt::print(out, "# note: {}\n", note);
}

// What the collective sweeps share, and what they add up.
struct Sweeps {
  const MeasureOptions& o;
  comm::Communicator& host_world;
  comm::Watchdog& watchdog;
  ProgressBar& progress;
  std::ostream& out;
  BenchSettings settings;
  bool root;
  std::int64_t point_index = 0;  // --inject-fault's STEP
  std::int64_t wrong_total = 0;
};

// One collective over one group at every size; on the root, each size's row of its table as
// soon as it is measured (as nccl-tests prints), then the fitted curve.
void sweep_collective(Sweeps& s, documents::Collective op, const PlannedGroup& g,
                      comm::Communicator& group, CalibrationRecord& record) {
  const auto points = sweep_points(op, g.ranks, s.o.range, sizeof(float));
  if (points.empty()) return;
  CollectiveBench bench(op, group, s.host_world, points.back(), s.settings);
  SweepTablePrinter table(s.out, op, g);
  std::vector<documents::MeasuredSample> samples;
  for (const auto& p : points) {
    const auto phase = fmt::format("{} {} {}", documents::traits(op).name, g.name,
                                   human_bytes(static_cast<double>(p.size_bytes)));
    s.progress.show(phase);
    // A point is all collectives: every rank waits for the others through it.
    s.watchdog.set_phase(phase, true);
    comm::inject_due_fault(s.o.fault, s.host_world.rank(), ++s.point_index, s.watchdog,
                           [] { throw std::bad_alloc(); });
    const PointResult result = bench.run(p);
    s.progress.step();
    if (!s.root) continue;
    s.progress.clear();  // the bar is redrawn below the row by the next point's show
    table.add(result);
    samples.push_back({static_cast<double>(result.point.size_bytes), result.time_s});
    s.wrong_total += std::max<std::int64_t>(0, result.wrong);
  }
  if (!s.root) return;
  s.progress.clear();
  table.finish();
  FittedCurve curve{op, g.ranks, g.tier, fit_piecewise(samples, s.o.fit), s.o.fit};
  print_fit(s.out, curve.fit);
  record.curves.push_back(std::move(curve));
  s.out.flush();
}

// GEMM, memory bandwidth and attention, where asked for.
ComputeCalibration measure_compute_phase(const MeasureOptions& o, const Preflight& pre,
                                         comm::Communicator& host_world,
                                         comm::Communicator& backend_world,
                                         comm::Watchdog& watchdog, ProgressBar& progress) {
  ComputeCalibration compute;
  if (o.gemm || o.memory || pre.attention.batch > 0) {
    const char* phase = pre.attention.batch > 0 ? "GEMM, attention and memory bandwidth"
                                                : "GEMM and memory bandwidth";
    if (host_world.rank() == 0) progress.show(phase);
    watchdog.set_phase(phase);
    std::optional<documents::AttentionShape> attention;
    if (pre.attention.batch > 0) attention = pre.attention;
    compute = measure_compute({o.gemm, o.memory, pre.model_shapes, pre.elementwise_ops,
                               o.gemm_tokens, pre.head_dim, attention},
                              host_world, backend_world);
    progress.clear();
  }
  return compute;
}

void print_fit_errors(std::ostream& out, const MeasureOptions& o, const CalibrationRecord& record) {
  fmt::print(out,
             "#\n# fit errors at the measured sizes (goal: median <= {:.0f}%, max <= {:.0f}%):\n",
             100 * o.fit.median_goal, 100 * o.fit.max_goal);
  for (const auto& c : record.curves)
    fmt::print(out, "#   {:<15} {:>4} ranks  {:<10}  median {:5.1f}%  max {:5.1f}%  {} piece{}{}\n",
               documents::traits(c.op).name, c.ranks, documents::tier_name(c.tier),
               100 * c.fit.median_rel_error, 100 * c.fit.max_rel_error, c.fit.segments.size(),
               c.fit.segments.size() == 1 ? "" : "s", c.fit.meets(o.fit) ? "" : "  (goal missed)");
}

// On the root, after every measurement: the compute lines, the fit errors, and the profile
// (not written when a checked result was wrong).
int write_profile(const MeasureOptions& o, const Preflight& pre, const GroupPlan& plan,
                  const comm::Topology& topology, const ComputeCalibration& compute,
                  CalibrationRecord& record, std::int64_t wrong_total, std::ostream& out,
                  std::ostream& err) {
  if (!compute.gemm.empty()) print_gemm_table(out, compute.gemm);
  record.extra = {{"sweep", sweep_extra(o, plan)}};
  MeasuredSystem system;
  system.name = std::filesystem::path(pre.out_path).stem().string();
  add_compute(o, compute, pre, topology, record, system);
  if (compute.memory_bandwidth_Bps)
    fmt::print(out, "# memory copy bandwidth (read + write, slowest rank): {:.2f} GB/s\n",
               *compute.memory_bandwidth_Bps / 1e9);
  if (record.compute_efficiency)
    fmt::print(out, "# compute efficiency ({} model-shape GEMMs / {}): {:.3g}\n",
               documents::dtype_name(compute.model_dtype),
               record.extra.value("compute_efficiency_reference", std::string("peak")),
               *record.compute_efficiency);
  print_attention_lines(out, compute.attention);
  print_fit_errors(out, o, record);
  if (!allow_poor_fits(record, o.accept_poor_fit, err)) return 1;
  if (wrong_total > 0) {
    fmt::print(err,
               "calibrate: {} wrong elements in the checked results (see #wrong); the profile is "
               "not written\n",
               wrong_total);
    return 1;
  }

  const json section = calibration_to_json(record);
  const json document = pre.into_profile.is_null() ? measured_profile(system, record)
                                                   : merge_calibration(pre.into_profile, section);
  documents::hardware_from_json(document, system.name);  // what the planner will read
  core::write_file(pre.out_path, core::json_text(document, 2) + "\n", pre.out_flag);
  fmt::print(out, "# wrote {}{}\n", pre.out_path,
             pre.into_profile.is_null()
                 ? ""
                 : fmt::format(" (calibration merged into {})", pre.into_path));
  return 0;
}

// `host_world`: every rank, on host memory (MPI's world, or NCCL's through staging buffers).
int measure(const MeasureOptions& o, comm::Communicator& host_world,
            const OpenBackend& open_backend, comm::Watchdog& watchdog, std::ostream& out,
            std::ostream& err) {
  const bool root = host_world.rank() == 0;
  const comm::Topology topology = comm::discover_topology(host_world);

  watchdog.set_phase("checking the options and files");
  Preflight pre;
  GroupPlan plan;
  if (!check_options(o, host_world, topology, err, plan, pre)) return 2;

  watchdog.set_phase(fmt::format("opening the {} backend", backend_name(o.backend)));
  auto backend_world = open_backend(topology);
  // NCCL's communicators are aborted before the watchdog ends the job (their kernels stop).
  std::optional<comm::Watchdog::Watched> watched_backend;
  watched_backend.emplace(watchdog, *backend_world);
  const std::string library = backend_world->library_version();
  if (root) print_header(out, o, topology, library, plan);

  int total_steps = 0;
  for (const auto& g : plan.groups)
    for (auto op : o.ops)
      total_steps += static_cast<int>(sweep_points(op, g.ranks, o.range, sizeof(float)).size());
  ProgressBar progress(err, total_steps, root && isatty(STDERR_FILENO));

  CalibrationRecord record;
  record.date = utc_timestamp();
  record.backend = backend_name(o.backend);
  record.host = topology.host_list();
  record.library = library;
  record.ranks = topology.size;
  Sweeps sweeps{o, host_world, watchdog, progress, out, {}, root};
  sweeps.settings.warmup = o.warmup;
  sweeps.settings.iters = o.iters;
  sweeps.settings.check = o.check;
  for (const auto& g : plan.groups) {
    auto group = comm::make_group(*backend_world, topology, g.spec);
    const auto watched_group = watchdog.watch(*group);
    for (auto op : o.ops) sweep_collective(sweeps, op, g, *group, record);
  }
  progress.clear();

  const ComputeCalibration compute =
      measure_compute_phase(o, pre, host_world, *backend_world, watchdog, progress);
  watched_backend.reset();
  backend_world.reset();
  if (!root) return 0;
  watchdog.set_phase("writing the profile");
  return write_profile(o, pre, plan, topology, compute, record, sweeps.wrong_total, out, err);
}

#if defined(SHARDPLAN_HAVE_MPI)
// Ranks from mpirun or srun: the host world is MPI's; NCCL's unique id travels over it.
int run_under_mpi(const MeasureOptions& options, std::ostream& out, std::ostream& err) {
  comm::MpiEnvironment mpi;
  // No rank waits for ever: a rank that stops ends the job after --timeout-s, one that fails
  // says so (comm/watchdog.hpp).
  comm::Watchdog watchdog(
      {.program = "calibrate", .rank = mpi.world_rank(), .timeout_s = options.timeout_s},
      [&mpi](int exit_code) { mpi.abort(exit_code); });
  auto host_world = mpi.world();
  const OpenBackend open_backend =
      [&](const comm::Topology& topology) -> std::unique_ptr<comm::Communicator> {
#if defined(SHARDPLAN_HAVE_NCCL)
    if (options.backend == BackendKind::nccl)
      return comm::NcclCommunicator::create(*host_world, topology.local_rank);
#endif
    (void)topology;
    // A communicator of its own, so nothing else shares the measured traffic.
    return host_world->split_mpi(0, host_world->rank());
  };
  try {
    return measure(options, *host_world, open_backend, watchdog, out, err);
  } catch (const InputError& e) {
    fmt::print(err, "calibrate: {}\n", e.what());  // rank 0 only (a file it could not write)
    host_world.reset();
    return 2;
  } catch (const std::exception& e) {
    // A CommError names the call, the host and the rank; the line adds the phase. The other
    // ranks may wait in a collective for ever: the abort ends them.
    err.flush();
    watchdog.fail(e.what(), 1);  // "calibrate: rank R on H: failed in phase 'P': ..."
  }
}
#endif

#if defined(SHARDPLAN_HAVE_NCCL)
// Ranks without MPI: from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT; comm/launch_env.hpp), or one process started by hand, which is rank 0
// of 1. NCCL's unique id travels over TCP (NcclCommunicator::create_from_environment); the host
// exchanges run on that NCCL world through staging buffers; the measured collectives run on a
// communicator split off it, so nothing else shares their traffic.
int run_from_environment(const MeasureOptions& options, std::ostream& out, std::ostream& err) {
  comm::LaunchEnvironment environment;  // rank 0 of 1
  try {
    if (comm::launched_with_torchrun_environment()) environment = comm::read_launch_environment();
  } catch (const InputError& e) {
    fmt::print(err, "calibrate: {}\n", e.what());
    return 2;
  }
  comm::set_process_rank(environment.rank);
  // Without MPI_Abort a rank can only end itself; torchrun then ends the others (it stops every
  // worker once one has failed), and their NCCL communicators are aborted first.
  comm::Watchdog watchdog(
      {.program = "calibrate", .rank = environment.rank, .timeout_s = options.timeout_s},
      [](int exit_code) { std::_Exit(exit_code); });
  std::unique_ptr<comm::NcclCommunicator> world;
  std::optional<comm::Watchdog::Watched> watched_world;
  try {
    watchdog.set_phase(environment.world_size > 1 ? "joining the ranks (NCCL's id over TCP)"
                                                  : "opening NCCL",
                       true);
    world = comm::NcclCommunicator::create_from_environment(environment, options.timeout_s);
    watched_world.emplace(watchdog, *world);
    StagedHostCommunicator host_world(*world);
    const OpenBackend open_backend = [&](const comm::Topology&) {
      return world->split(0, world->rank());
    };
    return measure(options, host_world, open_backend, watchdog, out, err);
  } catch (const InputError& e) {
    fmt::print(err, "calibrate: {}\n", e.what());  // rank 0 only (a file it could not write)
    return 2;
  } catch (const std::exception& e) {
    out.flush();
    err.flush();
    watchdog.fail(e.what(), 1);  // "calibrate: rank R on H: failed in phase 'P': ..."
  }
}
#endif

}  // namespace

int run_measurement(const MeasureOptions& options, std::ostream& out, std::ostream& err) {
#if defined(SHARDPLAN_HAVE_NCCL)
#if defined(SHARDPLAN_HAVE_MPI)
  const bool from_environment =
      options.backend == BackendKind::nccl && comm::launched_with_torchrun_environment();
#else
  const bool from_environment = options.backend == BackendKind::nccl;
#endif
  if (from_environment) return run_from_environment(options, out, err);
#endif
#if defined(SHARDPLAN_HAVE_MPI)
  return run_under_mpi(options, out, err);
#else
  (void)out;
  fmt::print(err, "calibrate: --backend: {}: this calibrate was built without MPI\n",
             backend_name(options.backend));
  return 2;
#endif
}

}  // namespace shardplan::calibrate
