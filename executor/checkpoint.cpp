#include "executor/checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "documents/sharding.hpp"
#include "executor/checkpoint_format.hpp"
#include "executor/sha256.hpp"
#include "kernels/adamw.hpp"

namespace shardplan::executor {

using kernels::adamw_step;

using namespace checkpoint_format;

namespace {

const char* kind_name(UnitKind k) {
  switch (k) {
  case UnitKind::embedding:
    return "embedding";
  case UnitKind::block:
    return "block";
  case UnitKind::head:
    return "head";
  }
  return "?";
}

// ---- agreement across ranks

// Runs f, keeping an InputError (or a filesystem error, which names its path) for agree().
template <class F> void capture(std::optional<InputError>& failure, F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    failure = e;
  } catch (const fs::filesystem_error& e) {
    failure = InputError(e.path1().string(), e.code().message());
  }
}

// Collective: when any rank failed, every rank throws the lowest failing rank's error, so that
// rank 0 (the one that prints) reports it and no rank waits in a collective the others have left.
void agree(comm::Communicator& world, const std::optional<InputError>& failure) {
  const std::int32_t mine = failure ? world.rank() : world.size();
  std::int32_t first = 0;
  world.all_reduce(&mine, &first, 1, comm::DataType::i32, comm::ReduceOp::min);
  if (first == world.size()) return;
  std::string where, message;
  if (failure) {
    where = failure->where();
    const std::string what = failure->what();
    message = what.size() > where.size() + 2 ? what.substr(where.size() + 2) : what;
  }
  std::string text = where + '\n' + message;
  std::int64_t length = static_cast<std::int64_t>(text.size());
  world.broadcast(&length, 1, comm::DataType::i64, first);
  text.resize(static_cast<std::size_t>(length));
  world.broadcast(text.data(), text.size(), comm::DataType::u8, first);
  const auto cut = text.find('\n');
  throw InputError(text.substr(0, cut), text.substr(cut + 1));
}

}  // namespace

// ---- layout of the parts

namespace checkpoint_format {

std::string step_folder(std::int64_t step) { return fmt::format("step-{:08}", step); }

// A segment's sha256 covers its label, then its bytes (checkpoint.hpp), so that a range moved to
// another place in the index, or given another tensor's name, no longer matches.
Sha256 segment_hash(const CheckpointSegment& s) {
  const std::string label =
      fmt::format("shardplan.checkpoint segment {} {} {} {}\n", s.tensor, s.unit, s.begin, s.end);
  Sha256 hash;
  hash.update(label.data(), label.size());
  return hash;
}

Held held(const ShardingEngine::UnitState& st, std::string_view tensor) {
  if (tensor == "params") return {st.params, st.params_begin};
  return {tensor == "exp_avg" ? st.exp_avg : st.exp_avg_sq, st.optimizer_begin};
}

}  // namespace checkpoint_format

namespace {

std::string part_path(std::int64_t step, int part, int parts) {
  return fmt::format("{}/part-{:05}-of-{:05}.bin", step_folder(step), part, parts);
}

// Part `part`'s ranges: [part·chunk, min((part+1)·chunk, n)) of every tensor of every unit.
std::vector<CheckpointSegment> part_segments(const ShardLayout& sl, int part) {
  std::vector<CheckpointSegment> out;
  std::int64_t offset = 0;
  for (const char* tensor : kTensors)
    for (std::size_t u = 0; u < sl.units.size(); ++u) {
      const auto& us = sl.units[u];
      const std::int64_t begin = part * us.chunk, end = std::min(begin + us.chunk, us.size);
      if (begin >= end) continue;  // this part's chunk of a small unit is all padding
      out.push_back({tensor, static_cast<std::int64_t>(u), begin, end, offset, ""});
      offset += (end - begin) * kFloat;
    }
  return out;
}

// The sha256s of a part: the whole file's, then each segment's, in the file's order.
using PartDigests = std::vector<Sha256::Digest>;

PartDigests write_part(ShardingEngine& engine, const fs::path& path) {
  const auto& sl = engine.shards();
  HashedFile file(path);
  PartDigests digests(1);
  for (const auto& seg : part_segments(sl, sl.shard_rank)) {
    const Held h = held(engine.unit_state(seg.unit), seg.tensor);
    const auto held_end = h.begin + static_cast<std::int64_t>(h.values.size());
    if (seg.begin < h.begin || seg.end > held_end)
      throw std::logic_error(fmt::format("{} of unit {}: [{}, {}) is not held", seg.tensor,
                                         seg.unit, seg.begin, seg.end));
    const auto* data = h.values.data() + (seg.begin - h.begin);
    const auto bytes = static_cast<std::size_t>((seg.end - seg.begin) * kFloat);
    file.write(data, bytes);
    auto hash = segment_hash(seg);
    hash.update(data, bytes);
    digests.push_back(hash.finish());
  }
  digests[0] = file.commit();
  return digests;
}

json segment_json(const CheckpointSegment& s) {
  return {{"tensor", s.tensor},
          {"unit", s.unit},
          {"begin", s.begin},
          {"end", s.end},
          {"offset_bytes", s.offset_bytes},
          {"sha256", s.sha256}};
}

std::int64_t segments_bytes(const std::vector<CheckpointSegment>& segments) {
  return segments.empty() ? 0
                          : segments.back().offset_bytes +
                                (segments.back().end - segments.back().begin) * kFloat;
}

}  // namespace

json model_shape_json(const GptLayout& layout) {
  const auto& m = layout.spec();
  json units = json::array();
  for (std::int64_t u = 0; u < layout.unit_count(); ++u)
    units.push_back(
        {{"kind", kind_name(layout.unit_kind(u))}, {"elements", layout.unit_size_of(u)}});
  json tensors = json::object();
  for (auto kind : {UnitKind::embedding, UnitKind::block, UnitKind::head}) {
    json list = json::array();
    for (const auto& slot : layout.slots(kind))
      list.push_back({{"name", slot.tensor.name},
                      {"offset", slot.offset},
                      {"shape", {slot.tensor.rows, slot.tensor.cols}}});
    tensors[kind_name(kind)] = list;
  }
  return {{"name", m.name},
          {"hidden", m.hidden},
          {"layers", m.layers},
          {"heads", m.heads},
          {"kv_heads", m.kv_heads},
          {"head_dim", m.head_dim},
          {"intermediate", m.intermediate},
          {"vocab", m.vocab},
          {"max_positions", m.max_positions},
          {"tied_embeddings", m.tied_embeddings},
          {"parallel_residual", m.parallel_residual},
          {"units", units},
          {"tensors", tensors}};
}

void save_checkpoint(ShardingEngine& engine, comm::Communicator& world, const std::string& dir) {
  const auto& sl = engine.shards();
  if (world.size() != sl.world)
    throw std::invalid_argument(
        fmt::format("a world of {} ranks saves an engine of {} ranks", world.size(), sl.world));
  const std::int64_t step = engine.steps_done();
  const fs::path root(dir);
  const std::string folder = step_folder(step);
  std::optional<InputError> failure;
  if (world.rank() == 0)
    capture(failure, [&] {
      fs::create_directories(root);
      make_step_folder(root / folder);
    });
  agree(world, failure);

  // The first shard group writes: its rank s holds (at least) part s of every tensor. Every rank
  // gets every part's digests: the file's, then its segments' (at most one per tensor and unit).
  const std::size_t slots = 1 + kTensors.size() * sl.units.size();
  constexpr std::size_t kDigest = std::tuple_size_v<Sha256::Digest>;
  std::vector<std::uint8_t> mine(slots * kDigest);
  if (sl.replica_rank == 0)
    capture(failure, [&] {
      const auto digests = write_part(engine, root / part_path(step, sl.shard_rank, sl.group));
      for (std::size_t k = 0; k < digests.size(); ++k)
        std::copy(digests[k].begin(), digests[k].end(),
                  mine.begin() + static_cast<std::ptrdiff_t>(k * kDigest));
    });
  agree(world, failure);
  std::vector<std::uint8_t> all(mine.size() * static_cast<std::size_t>(world.size()));
  world.all_gather(mine.data(), all.data(), mine.size(), comm::DataType::u8);
  auto digest_of = [&](int rank, std::size_t slot) {
    Sha256::Digest d{};
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(
                                  (static_cast<std::size_t>(rank) * slots + slot) * kDigest),
                kDigest, d.begin());
    return Sha256::hex(d);
  };

  if (world.rank() == 0)
    capture(failure, [&] {
      json files = json::array();
      for (int s = 0; s < sl.group; ++s) {  // world rank s is shard rank s of the first group
        auto segments = part_segments(sl, s);
        json seg = json::array();
        for (std::size_t k = 0; k < segments.size(); ++k) {
          segments[k].sha256 = digest_of(s, 1 + k);
          seg.push_back(segment_json(segments[k]));
        }
        files.push_back({{"path", part_path(step, s, sl.group)},
                         {"bytes", segments_bytes(segments)},
                         {"sha256", digest_of(s, 0)},
                         {"segments", seg}});
      }
      const auto& o = engine.options();
      const json index = {
          {"schema_version", kSchemaVersion},
          {"kind", "shardplan.checkpoint"},
          {"step", step},
          {"adamw_step", step},
          {"byte_order", "little"},
          {"dtypes", {{"params", "f32"}, {"exp_avg", "f32"}, {"exp_avg_sq", "f32"}}},
          {"saved_by",
           {{"strategy", o.spec.strategy},
            {"flavour", documents::flavour_name(o.spec.flavour)},
            {"world_size", sl.world},
            {"shard_group", sl.group},
            {"seed", o.seed},
            {"lr", o.adamw.lr}}},
          {"model", model_shape_json(engine.layout())},
          {"files", files}};
      const std::string text = index.dump(1) + "\n";
      // The step folder's copy first: what marks the folder as this format's, for its removal.
      write_index(root / folder, text);
      write_index(root, text);
      remove_older_steps(root, step);
    });
  agree(world, failure);
}

LoadReport load_checkpoint(ShardingEngine& engine, comm::Communicator& world,
                           const std::string& dir) {
  std::optional<InputError> failure;
  CheckpointIndex index;
  capture(failure, [&] {
    index = read_checkpoint_index(dir);
    try {
      compare_shape(index.model, model_shape_json(engine.layout()), "/model");
    } catch (const InputError& e) {
      throw InputError(index_path(dir), e.what());
    }
    for (const auto& f : index.files) check_size(dir, f);
  });
  agree(world, failure);
  // Each file's checksum once over the job.
  capture(failure, [&] {
    for (std::size_t k = 0; k < index.files.size(); ++k)
      if (static_cast<int>(k % static_cast<std::size_t>(world.size())) == world.rank())
        verify_checkpoint_file(dir, index.files[k]);
  });
  agree(world, failure);
  LoadReport report;
  report.step = index.step;
  capture(failure, [&] { report.bytes_read = read_ranges(engine, dir, index); });
  agree(world, failure);
  engine.set_steps_done(index.step);
  return report;
}

Consolidated consolidate_checkpoint(const std::string& dir, const std::string& out) {
  const auto index = read_checkpoint_index(dir);
  for (const auto& f : index.files) verify_checkpoint_file(dir, f);
  Consolidated c;
  c.step = index.step;
  // The whole model in memory (the executor held it to train it), then one output write: a
  // regular file whole or not at all, a device or a pipe written through (core/file_writer.hpp).
  std::string bytes_out;
  Sha256 hash;
  std::vector<char> block(kIoBlock);
  for (std::size_t u = 0; u < index.unit_elements.size(); ++u) {
    // The parameter segments of unit u, in element order (they tile it: parse_index checked).
    std::vector<std::pair<const CheckpointSegment*, std::string>> pieces;
    for (const auto& f : index.files)
      for (const auto& seg : f.segments)
        if (seg.tensor == std::string("params") && seg.unit == static_cast<std::int64_t>(u))
          pieces.emplace_back(&seg, file_path(dir, f));
    std::sort(pieces.begin(), pieces.end(),
              [](const auto& a, const auto& b) { return a.first->begin < b.first->begin; });
    for (const auto& [seg, path] : pieces) {
      const Fd fd = open_for_reading(path);
      const std::int64_t bytes = (seg->end - seg->begin) * kFloat;
      for (std::int64_t at = 0; at < bytes;) {
        const auto n = static_cast<std::size_t>(std::min<std::int64_t>(kIoBlock, bytes - at));
        read_at(fd.get(), block.data(), n, seg->offset_bytes + at, path);
        hash.update(block.data(), n);
        bytes_out.append(block.data(), n);
        at += static_cast<std::int64_t>(n);
      }
    }
    c.params += index.unit_elements[u];
  }
  core::write_file(out, bytes_out, "--out");
  c.sha256 = Sha256::hex(hash.finish());
  return c;
}

std::string params_sha256(ShardingEngine& engine) {
  Sha256 hash;
  // Under tensor parallelism, of the whole model (collective over the tensor-parallel group).
  const auto& tp = engine.options().model_options.tensor_parallel;
  for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u) {
    const auto p = gather_full_unit(tp, engine.layout(), u, engine.full_parameters(u));
    hash.update(p.data(), p.size() * sizeof(float));
  }
  return Sha256::hex(hash.finish());
}

std::vector<std::int64_t> saved_steps(std::int64_t first, std::int64_t steps, std::int64_t every) {
  std::vector<std::int64_t> out;
  for (std::int64_t step = first + 1; step <= first + steps; ++step)
    if (step == first + steps || (every > 0 && step % every == 0)) out.push_back(step);
  return out;
}

void check_save_destination(const CheckpointOptions& o, const ShardingEngine& engine,
                            const std::vector<std::int64_t>& steps) {
  const fs::path root(o.save_dir);
  for (const auto step : steps) check_step_folder(root / step_folder(step));
  std::error_code ec;
  const bool resumes_from_it =
      !o.resume_dir.empty() && fs::equivalent(o.save_dir, o.resume_dir, ec);
  struct stat st {};
  if (o.overwrite || resumes_from_it || steps.empty() ||
      (::lstat(index_path(o.save_dir).c_str(), &st) != 0 && errno == ENOENT))
    return;
  auto refuse = [&](const std::string& what) {
    throw InputError("--save",
                     fmt::format("\"{}\" holds {}; --overwrite replaces it", o.save_dir, what));
  };
  CheckpointIndex there;
  try {
    there = read_checkpoint_index(o.save_dir);
  } catch (const InputError& e) {
    refuse(fmt::format("what this executor does not read as a checkpoint ({})", e.what()));
  }
  // What saved it, for people (parse_index reads these leniently): "?" where it says nothing.
  auto text = [](const json& j, const char* key) {
    const auto it = j.find(key);
    return it != j.end() && (it->is_string() || it->is_number_integer()) ? it->dump() : "?";
  };
  const auto name = text(there.model, "name");
  const std::string held = fmt::format("the checkpoint of model {} at step {}", name, there.step);
  try {
    compare_shape(there.model, model_shape_json(engine.layout()), "/model");
  } catch (const InputError& e) {
    refuse(fmt::format("{}, another model than this run's ({})", held, e.what()));
  }
  const auto& opts = engine.options();
  const json run_plan = {{"strategy", opts.spec.strategy},
                         {"flavour", documents::flavour_name(opts.spec.flavour)},
                         {"world_size", engine.shards().world}};
  for (const char* key : {"strategy", "flavour", "world_size"})
    if (text(there.saved_by, key) != run_plan[key].dump())
      refuse(fmt::format("{}, saved by another plan (/saved_by/{} is {}, this run's {})", held, key,
                         text(there.saved_by, key), run_plan[key].dump()));
  if (there.step > steps.front())
    refuse(fmt::format("{}, later than step {}, the first this run saves", held, steps.front()));
}

RunCheckpoints::RunCheckpoints(CheckpointOptions options, comm::Communicator& world,
                               std::int64_t steps)
    : options_(std::move(options)), world_(world), steps_(steps) {}

void RunCheckpoints::start(ShardingEngine& engine) {
  // DIR locked for the run by the rank that writes its index, before anything is loaded.
  const bool save = !options_.save_dir.empty(), writer = world_.rank() == 0;
  std::optional<InputError> failure;
  if (save && writer) capture(failure, [&] { lock_ = CheckpointLock::take(options_.save_dir); });
  agree(world_, failure);
  if (!options_.resume_dir.empty())
    resumed_step_ = load_checkpoint(engine, world_, options_.resume_dir).step;
  // The same on every rank: no agreement needed.
  const std::int64_t first = engine.steps_done();
  if (first > kMaxCheckpointStep - steps_)
    throw InputError("--resume",
                     fmt::format("\"{}\" holds step {}: {} more steps pass step {}, "
                                 "the last a checkpoint may hold",
                                 options_.resume_dir, first, steps_, kMaxCheckpointStep));
  if (save && writer)
    capture(failure, [&] {
      check_save_destination(options_, engine, saved_steps(first, steps_, options_.save_every));
    });
  agree(world_, failure);
  initial_sha256_ = params_sha256(engine);
}

void RunCheckpoints::after_step(ShardingEngine& engine, bool last) {
  const std::int64_t step = engine.steps_done();
  if (!options_.save_dir.empty() &&
      (last || (options_.save_every > 0 && step % options_.save_every == 0))) {
    save_checkpoint(engine, world_, options_.save_dir);
    saved_steps_.push_back(step);
  }
  if (last) final_sha256_ = params_sha256(engine);
}

void RunCheckpoints::report(json& doc) const {
  doc["initial_params_sha256"] = initial_sha256_;
  doc["final_params_sha256"] = final_sha256_;
  if (resumed_step_)
    doc["execution"]["resumed_from"] = {{"dir", options_.resume_dir}, {"step", *resumed_step_}};
  if (!saved_steps_.empty())
    doc["execution"]["saved"] = {{"dir", options_.save_dir}, {"steps", saved_steps_}};
}

}  // namespace shardplan::executor
