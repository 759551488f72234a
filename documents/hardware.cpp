#include "documents/hardware.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "documents/model.hpp"

namespace shardplan::documents {

using core::describe_value;
using core::InputError;
using core::ObjectReader;
using core::Range;
using core::read_json_document;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;  // 2^30
constexpr double kGB = 1e9;

DType dtype_from(const std::string& s, const std::string& where) {
  if (s == "fp32") return DType::fp32;
  if (s == "tf32") return DType::tf32;
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::fp16;
  throw InputError(where, fmt::format("must be one of fp32, tf32, bf16, fp16, got \"{}\"", s));
}

Tier tier_from(const std::string& s, const std::string& where) {
  if (s == "intra_node") return Tier::intra_node;
  if (s == "inter_node") return Tier::inter_node;
  throw InputError(where, fmt::format("must be intra_node or inter_node, got \"{}\"", s));
}

CollectiveCurve read_curve(const nlohmann::json& j, const std::string& ptr) {
  ObjectReader r(j, ptr);
  CollectiveCurve c;
  const auto op_name = r.string("op");
  const auto op = collective_from_name(op_name);
  if (!op) throw InputError(r.pointer_of("op"), fmt::format("unknown collective \"{}\"", op_name));
  c.op = *op;
  c.ranks = static_cast<int>(r.integer("ranks", Range{1, 1e7, false}));
  c.tier = tier_from(r.string("tier"), r.pointer_of("tier"));
  const auto& segs = r.array("segments");
  if (segs.empty()) throw InputError(r.pointer_of("segments"), "must not be empty");
  for (std::size_t i = 0; i < segs.size(); ++i) {
    ObjectReader s(segs[i], fmt::format("{}/segments/{}", ptr, i));
    CurveSegment seg;
    seg.min_bytes = s.number("min_bytes", Range::non_negative());
    seg.max_bytes = s.number("max_bytes", Range::non_negative());
    if (seg.max_bytes < seg.min_bytes)
      throw InputError(s.pointer_of("max_bytes"), fmt::format("must be >= min_bytes {}, got {}",
                                                              seg.min_bytes, seg.max_bytes));
    seg.latency_s = s.number("latency_us", Range::non_negative()) * 1e-6;
    seg.bandwidth_Bps = s.number("bandwidth_GBps", Range::positive()) * kGB;
    s.finish();
    c.segments.push_back(seg);
  }
  if (const auto* samples = r.optional_array("samples")) {
    for (std::size_t i = 0; i < samples->size(); ++i) {
      ObjectReader s((*samples)[i], fmt::format("{}/samples/{}", ptr, i));
      MeasuredSample m;
      m.size_bytes = s.number("size_bytes", Range::non_negative());
      m.time_s = s.number("time_us", Range::positive()) * 1e-6;
      s.finish();
      c.samples.push_back(m);
    }
  }
  if (const auto* err = r.optional_object("fit_error")) {
    ObjectReader e(*err, r.pointer_of("fit_error"));
    c.median_rel_error = e.number("median_rel", Range::non_negative());
    c.max_rel_error = e.number("max_rel", Range::non_negative());
    c.goal_median_rel_error = e.optional_number("goal_median_rel", Range::positive());
    c.goal_max_rel_error = e.optional_number("goal_max_rel", Range::positive());
    e.finish();
  }
  r.finish();
  return c;
}

Calibration read_calibration(const nlohmann::json& j, const std::string& ptr) {
  ObjectReader r(j, ptr);
  Calibration c;
  c.date = r.string("date");
  c.backend = r.choice("backend", {"nccl", "mpi"});
  c.host = r.optional_string("host").value_or("");
  c.library = r.optional_string("library").value_or("");
  c.ranks = static_cast<int>(r.integer("ranks", Range{1, 1e7, false}));
  if (const auto* cs = r.optional_array("collectives"))
    for (std::size_t i = 0; i < cs->size(); ++i)
      c.collectives.push_back(read_curve((*cs)[i], fmt::format("{}/collectives/{}", ptr, i)));
  if (const auto* gs = r.optional_array("gemm")) {
    for (std::size_t i = 0; i < gs->size(); ++i) {
      ObjectReader g((*gs)[i], fmt::format("{}/gemm/{}", ptr, i));
      GemmSample s;
      s.m = g.integer("m", Range{1, 1e7, false});
      s.n = g.integer("n", Range{1, 1e7, false});
      s.k = g.integer("k", Range{1, 1e7, false});
      s.dtype = dtype_from(g.string("dtype"), g.pointer_of("dtype"));
      s.time_s = g.number("time_us", Range::positive()) * 1e-6;
      g.ignore("TFLOPs");
      g.finish();
      c.gemm.push_back(s);
    }
  }
  c.compute_efficiency = r.optional_number("compute_efficiency", Range{0, 1, true});
  if (auto bw = r.optional_number("memory_bandwidth_GBps", Range::positive()))
    c.memory_bandwidth_Bps = *bw * kGB;
  if (auto rate = r.optional_number("elementwise_Gelems_per_s", Range::positive()))
    c.elementwise_elems_per_s = *rate * 1e9;
  if (const auto* sw = r.optional_object("straggler_wait")) {
    ObjectReader w(*sw, r.pointer_of("straggler_wait"));
    StragglerWait s;
    s.fraction = w.number("fraction", Range::between(0, 10));
    s.ranks = static_cast<int>(w.integer("ranks", Range{2, 1e7, false}));
    s.segment_s = w.number("segment_us", Range::positive()) * 1e-6;
    s.repetitions = static_cast<int>(w.integer("repetitions", Range{1, 1e9, false}));
    w.finish();
    c.straggler_wait = s;
  }
  if (const auto* as = r.optional_array("attention")) {
    for (std::size_t i = 0; i < as->size(); ++i) {
      ObjectReader a((*as)[i], fmt::format("{}/attention/{}", ptr, i));
      AttentionSample s;
      s.impl = a.choice("impl", {"eager", "flash"});
      s.dtype = dtype_from(a.string("dtype"), a.pointer_of("dtype"));
      s.batch = a.integer("batch", Range{1, 1e7, false});
      s.seq = a.integer("seq", Range{1, 1e8, false});
      s.heads = a.integer("heads", Range{1, 1e5, false});
      s.kv_heads = a.integer("kv_heads", Range{1, 1e5, false});
      if (s.heads % s.kv_heads != 0)
        throw InputError(a.pointer_of("kv_heads"),
                         fmt::format("must divide heads {}, got {}", s.heads, s.kv_heads));
      s.head_dim = a.integer("head_dim", Range{1, 1e5, false});
      s.forward_s = a.number("forward_us", Range::positive()) * 1e-6;
      s.backward_s = a.number("backward_us", Range::positive()) * 1e-6;
      a.finish();
      c.attention.push_back(s);
    }
  }
  if (const auto* extra = r.optional_object("extra")) c.extra = *extra;
  r.finish();
  return c;
}

// /framework: eager PyTorch's cost per kernel launch and each flavour's hooks (hardware.hpp).
void read_framework(const nlohmann::json& j, HardwareProfile& p) {
  // A host cost per kernel launch, unit, tensor or submodule is microseconds; a second of it
  // would be a host that does nothing else (calibrate bounds what it imports by its run).
  const Range host_us = Range::between(0.0, 1e6);
  ObjectReader r(j, "/framework");
  p.op_dispatch_s = r.number("op_dispatch_us", host_us) * 1e-6;
  ObjectReader flavours(r.object("flavours"), "/framework/flavours");
  for (const char* name : {"ddp", "fsdp1", "fsdp2", "deepspeed_zero12", "deepspeed_zero3"}) {
    const auto* f = flavours.optional_object(name);
    if (f == nullptr) continue;
    ObjectReader o(*f, flavours.pointer_of(name));
    FrameworkOverheads x;
    x.forward_unit_s = o.number("forward_unit_us", host_us) * 1e-6;
    x.backward_unit_s = o.number("backward_unit_us", host_us) * 1e-6;
    x.forward_tensor_s = o.number("forward_tensor_us", host_us) * 1e-6;
    x.backward_tensor_s = o.number("backward_tensor_us", host_us) * 1e-6;
    x.forward_submodule_s = o.optional_number("forward_submodule_us", host_us).value_or(0) * 1e-6;
    x.backward_submodule_s = o.optional_number("backward_submodule_us", host_us).value_or(0) * 1e-6;
    o.finish();
    p.framework[name] = x;
  }
  flavours.finish();
  r.ignore("source");
  r.finish();
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
  case DType::fp32:
    return "fp32";
  case DType::tf32:
    return "tf32";
  case DType::bf16:
    return "bf16";
  case DType::fp16:
    return "fp16";
  }
  return "?";
}

const char* tier_name(Tier t) { return t == Tier::intra_node ? "intra_node" : "inter_node"; }

double CollectiveCurve::time_s(double size_bytes) const {
  const CurveSegment* seg = &segments.front();
  for (const auto& s : segments) {
    seg = &s;
    if (size_bytes <= s.max_bytes) break;
  }
  return seg->latency_s + size_bytes / seg->bandwidth_Bps;
}

double HardwareProfile::peak(DType d) const {
  for (DType t : {d, DType::bf16, DType::fp16, DType::fp32}) {
    auto it = peak_flops.find(t);
    if (it != peak_flops.end()) return it->second;
  }
  return 0.0;
}

namespace {
// The standard normal quantile Φ⁻¹(p), by bisection on Φ(x) = erfc(−x/√2)/2.
double normal_quantile(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::numbers::sqrt2) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// E[max of n independent standard normal variables] (the expected largest of n ranks' times, in
// standard deviations above their mean): exact values for n <= 8 (Harter 1961, "Expected values of
// normal order statistics", Biometrika 48, Table 1: 1/√π for n = 2), then Blom's approximation
// Φ⁻¹((n − 0.375) / (n + 0.25)) (Blom 1958, "Statistical Estimates and Transformed
// Beta-Variables").
double expected_normal_maximum(int n) {
  static constexpr double kExact[] = {0,       0,       0.56419, 0.84628, 1.02938,
                                      1.16296, 1.26721, 1.35218, 1.42360};
  if (n <= 8) return kExact[std::max(n, 0)];
  return normal_quantile((n - 0.375) / (n + 0.25));
}
}  // namespace

double HardwareProfile::straggler_wait_fraction(int ranks) const {
  if (!calibration || !calibration->straggler_wait || ranks < 2) return 0;
  const auto& s = *calibration->straggler_wait;
  // The slowest of n ranks runs E[max of n] standard deviations over the mean: scaled from the
  // measured rank count to this one.
  return s.fraction * expected_normal_maximum(ranks) / expected_normal_maximum(s.ranks);
}

double HardwareProfile::host_optimizer_rate(const std::string& family) const {
  const auto it = host_optimizer_by_framework.find(family);
  return it != host_optimizer_by_framework.end() ? it->second : host_optimizer_params_per_s;
}

namespace {

void read_gpu(ObjectReader& r, const nlohmann::json& doc, HardwareProfile& p) {
  ObjectReader gpu(r.object("gpu"), "/gpu");
  p.device = gpu.string("name");
  p.memory_bytes = gpu.number("memory_GiB", Range{0, 1e6, true}) * kGiB;
  ObjectReader peak(gpu.object("peak_TFLOPs"), "/gpu/peak_TFLOPs");
  for (DType d : {DType::fp32, DType::tf32, DType::bf16, DType::fp16})
    if (auto v = peak.optional_number(dtype_name(d), Range{0, 1e6, true}))
      p.peak_flops[d] = *v * 1e12;
  p.fp8_peak_flops = peak.optional_number("fp8", Range{0, 1e6, true}).value_or(0) * 1e12;
  peak.finish();
  if (!p.peak_flops.contains(DType::fp32)) throw InputError("/gpu/peak_TFLOPs/fp32", "missing key");
  p.hbm_bandwidth_Bps = gpu.number("memory_bandwidth_GBps", Range{0, 1e6, true}) * kGB;
  p.compute_efficiency = gpu.number("compute_efficiency", Range{0, 1, true});
  p.sm_count = static_cast<int>(gpu.optional_integer("sm_count", Range{1, 1e5, false}).value_or(0));
  if (const auto* clock = gpu.optional_object("clock_MHz")) {
    ObjectReader c(*clock, "/gpu/clock_MHz");
    p.boost_clock_hz = c.number("boost", Range{0, 1e5, true}) * 1e6;
    p.sustained_clock_hz = c.number("sustained", Range{0, 1e5, true}) * 1e6;
    if (p.sustained_clock_hz > p.boost_clock_hz)
      throw InputError("/gpu/clock_MHz/sustained",
                       fmt::format("must be <= boost {} (the peak is at boost), got {}",
                                   p.boost_clock_hz / 1e6, p.sustained_clock_hz / 1e6));
    c.finish();
  }
  p.power_limit_w = gpu.optional_number("power_limit_W", Range{0, 1e5, true}).value_or(0);
  p.memory_bandwidth_efficiency =
      gpu.optional_number("memory_bandwidth_efficiency", Range{0, 1, true}).value_or(1.0);
  p.is_cpu = gpu.optional_string("kind").value_or("gpu") == "cpu";
  if (gpu.has("kind") && !p.is_cpu && doc["gpu"]["kind"] != "gpu")
    throw InputError("/gpu/kind",
                     fmt::format("must be gpu or cpu, got {}", describe_value(doc["gpu"]["kind"])));
  if (const auto c = gpu.optional_string("collectives")) {
    if (*c != "blocking" && *c != "overlapped")
      throw InputError("/gpu/collectives",
                       fmt::format("must be blocking or overlapped, got \"{}\"", *c));
    if (!p.is_cpu && *c == "blocking")
      throw InputError("/gpu/collectives",
                       "a GPU's collectives run on their own streams: only a cpu kind blocks");
    p.collectives_block = *c == "blocking";
  } else {
    p.collectives_block = p.is_cpu;
  }
  gpu.ignore("source");
  gpu.finish();
}

// The links between GPUs: within a node, and between nodes.
void read_links(ObjectReader& r, const nlohmann::json& doc, HardwareProfile& p) {
  ObjectReader intra(r.object("intra_node"), "/intra_node");
  intra.ignore("link");
  p.intra_bandwidth_Bps = intra.number("bandwidth_GBps", Range{0, 1e6, true}) * kGB;
  p.intra_latency_s = intra.number("latency_us", Range{0, 1e6, false}) * 1e-6;
  intra.ignore("source");
  intra.finish();

  ObjectReader inter(r.object("inter_node"), "/inter_node");
  inter.ignore("link");
  // The unit is in the key: a NIC's rate is quoted per node as often as per GPU (100 GbE per node
  // is 12.5 GB/s per node, 1.5625 GB/s per GPU of 8), and reading one as the other is 8x off.
  if (inter.has("bandwidth_GBps"))
    throw InputError("/inter_node/bandwidth_GBps",
                     fmt::format("the unit is ambiguous, got {}: rename it bandwidth_GBps_per_gpu "
                                 "(its old meaning: each GPU's share of the node's NICs) or give "
                                 "bandwidth_GBps_per_node",
                                 describe_value(doc["inter_node"]["bandwidth_GBps"])));
  const bool per_gpu = inter.has("bandwidth_GBps_per_gpu"),
             per_node = inter.has("bandwidth_GBps_per_node");
  if (per_gpu == per_node)
    throw InputError(per_gpu ? "/inter_node/bandwidth_GBps_per_node"
                             : "/inter_node/bandwidth_GBps_per_gpu",
                     per_gpu ? "give bandwidth_GBps_per_gpu or bandwidth_GBps_per_node, not both"
                             : "missing key (or give bandwidth_GBps_per_node)");
  if (per_gpu) {
    p.inter_bandwidth_Bps = inter.number("bandwidth_GBps_per_gpu", Range{0, 1e6, true}) * kGB;
  } else {
    p.inter_bandwidth_Bps =
        inter.number("bandwidth_GBps_per_node", Range{0, 1e9, true}) * kGB / p.gpus_per_node;
    p.inter_bandwidth_per_node_key = true;
  }
  p.inter_latency_s = inter.number("latency_us", Range{0, 1e6, false}) * 1e-6;
  inter.ignore("source");
  inter.finish();
}

void read_host(ObjectReader& r, const nlohmann::json& doc, HardwareProfile& p) {
  ObjectReader host(r.object("host"), "/host");
  p.host_memory_bytes = host.number("memory_GiB", Range{0, 1e9, true}) * kGiB;
  p.host_link_Bps = host.number("link_bandwidth_GBps", Range{0, 1e6, true}) * kGB;
  // One rate for every framework, or one per family: {"deepspeed": x, "torch": y}.
  if (const auto* by =
          host.has("optimizer_Gparams_per_s") && doc["host"]["optimizer_Gparams_per_s"].is_object()
              ? host.optional_object("optimizer_Gparams_per_s")
              : nullptr) {
    ObjectReader o(*by, "/host/optimizer_Gparams_per_s");
    for (const char* family : {"deepspeed", "torch"})
      p.host_optimizer_by_framework[family] = o.number(family, Range{0, 1e6, true}) * 1e9;
    o.finish();
  } else {
    p.host_optimizer_params_per_s =
        host.number("optimizer_Gparams_per_s", Range{0, 1e6, true}) * 1e9;
  }
  host.ignore("source");
  host.finish();
}

}  // namespace

HardwareProfile hardware_from_json(const nlohmann::json& doc, const std::string& name) {
  ObjectReader r(doc, "");
  const auto version = r.integer("schema_version");
  if (version != 1) throw InputError("/schema_version", fmt::format("must be 1, got {}", version));
  r.optional_string("generator");  // calibrate's version, in a measured profile
  HardwareProfile p;
  p.name = name;
  p.description = r.string("description");
  r.ignore("name");
  read_gpu(r, doc, p);

  ObjectReader node(r.object("node"), "/node");
  p.gpus_per_node = static_cast<int>(node.integer("gpus_per_node", Range{1, 1024, false}));
  node.ignore("source");
  node.finish();

  read_links(r, doc, p);
  read_host(r, doc, p);

  ObjectReader over(r.object("overhead"), "/overhead");
  p.cuda_context_bytes = over.number("cuda_context_GiB", Range::between(0, 1e3)) * kGiB;
  p.nccl_workspace_bytes = over.number("nccl_workspace_GiB", Range::between(0, 1e3)) * kGiB;
  p.fragmentation = over.number("fragmentation", Range::between(0, 1));
  over.ignore("source");
  over.finish();

  if (const auto* fw = r.optional_object("framework")) read_framework(*fw, p);
  if (const auto* cal = r.optional_object("calibration"))
    p.calibration = read_calibration(*cal, "/calibration");
  r.finish();
  return p;
}

std::vector<std::string> preset_hardware_names() {
  std::vector<std::string> names;
  const auto dir = std::filesystem::path(data_dir()) / "hardware_profiles";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

HardwareProfile load_hardware(const std::string& name_or_path) {
  std::filesystem::path path(name_or_path);
  std::error_code ec;
  if (path.extension() != ".json" || !std::filesystem::exists(path, ec)) {
    const auto preset =
        std::filesystem::path(data_dir()) / "hardware_profiles" / (name_or_path + ".json");
    // Not a profile's name but something on disk (/dev/zero, a FIFO, a file named without .json):
    // read as a file, which says what it is.
    if (!std::filesystem::exists(preset, ec) &&
        std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
      return read_json_document(path.string(), [&](const nlohmann::json& doc) {
        return hardware_from_json(doc, path.stem().string());
      });
    if (!std::filesystem::exists(preset, ec))
      throw InputError("--hardware",
                       fmt::format("\"{}\" is neither a profile ({}) nor a file", name_or_path,
                                   fmt::join(preset_hardware_names(), ", ")));
    path = preset;
  }
  return read_json_document(path.string(), [&](const nlohmann::json& doc) {
    return hardware_from_json(doc, path.stem().string());
  });
}

nlohmann::json hardware_to_json(const HardwareProfile& p) {
  nlohmann::json peak = nlohmann::json::object();
  for (const auto& [d, v] : p.peak_flops) peak[dtype_name(d)] = v / 1e12;
  if (p.fp8_peak_flops > 0) peak["fp8"] = p.fp8_peak_flops / 1e12;
  return {{"name", p.name},
          {"description", p.description},
          {"device", p.device},
          {"memory_GiB", p.memory_bytes / kGiB},
          {"peak_TFLOPs", peak},
          {"gpus_per_node", p.gpus_per_node},
          {"intra_node_GBps", p.intra_bandwidth_Bps / kGB},
          {"inter_node_GBps_per_gpu", p.inter_bandwidth_Bps / kGB},
          {"inter_node_GBps_per_node", p.inter_bandwidth_Bps * p.gpus_per_node / kGB},
          {"calibrated", p.calibration.has_value()}};
}

}  // namespace shardplan::documents
