#include "executor/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/atomic_file.hpp"
#include "core/file_kind.hpp"
#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "core/text.hpp"
#include "documents/sharding.hpp"
#include "executor/sha256.hpp"

namespace shardplan::executor {
namespace {

namespace fs = std::filesystem;
using core::InputError;
using core::ObjectReader;
using core::Range;
using nlohmann::json;

// Parts hold the host's float bytes as they are; the format (and the parameter hash) is
// little-endian, so a big-endian host would need byte swaps that nothing here does.
static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian");

constexpr std::array<const char*, 3> kTensors = {"params", "exp_avg", "exp_avg_sq"};
constexpr std::int64_t kFloat = sizeof(float);
constexpr std::size_t kIoBlock = 1 << 20;  // bytes per read when a whole file is streamed
// Version 2 added the index's digest file and each segment's sha256; version 1 (neither) is
// refused: an index without them could be edited unnoticed.
constexpr int kSchemaVersion = 2;
constexpr const char* kIndex = "index.json";
constexpr const char* kIndexDigest = "index.json.sha256";
constexpr std::int64_t kMaxIndexBytes = std::int64_t{256} << 20;
constexpr std::int64_t kMaxIndexDigestBytes = 4096;
// The segments' bytes in one file: 8 PiB, far past any part, and far from 2^63 so that adding a
// segment (at most 4·1e15 bytes) to a sum below it cannot overflow.
constexpr std::int64_t kMaxFileBytes = std::int64_t{1} << 53;

std::string errno_text() { return std::strerror(errno); }

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

// ---- files

class Fd {
public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

private:
  int fd_ = -1;
};

Fd open_for_reading(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw InputError(path, fmt::format("cannot read: {}", errno_text()));
  return fd;
}

// Exactly `bytes` bytes at `offset`; fewer (the file ended) is a truncated file.
void read_at(int fd, void* data, std::size_t bytes, std::int64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(path, fmt::format("cannot read: {}", errno_text()));
    if (n == 0) throw InputError(path, fmt::format("truncated: ends at byte {}", offset));
    out += n;
    offset += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

// A small file this format wrote (an index or its digest) in the folder `dirfd`, read whole: a
// symbolic link is not followed, a FIFO or a device is refused without waiting, and a file past
// `limit` bytes is refused unread. `shown` names it in errors.
std::string read_own_file(int dirfd, const char* name, const std::string& shown,
                          std::int64_t limit) {
  Fd fd(::openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0)
    throw InputError(shown, errno == ELOOP ? "a symbolic link, which a checkpoint never writes"
                                           : fmt::format("cannot read: {}", errno_text()));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw InputError(shown, fmt::format("cannot read: {}", errno_text()));
  if (!S_ISREG(st.st_mode))
    throw InputError(shown, fmt::format("is {}, not a regular file", core::file_kind(st.st_mode)));
  if (st.st_size > limit)
    throw InputError(shown, fmt::format("{} bytes, past the limit of {} bytes", st.st_size, limit));
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  read_at(fd.get(), text.data(), text.size(), 0, shown);
  return text;
}

// A file written whole or not at all (core::AtomicFile), its bytes hashed as they are written.
class HashedFile {
public:
  explicit HashedFile(const fs::path& path) : file_(path.string()) {}

  void write(const void* data, std::size_t bytes) {
    hash_.update(data, bytes);
    file_.write(data, bytes);
  }

  // The bytes on the disk, under the temporary name: after this only the rename is left, which
  // needs no space. Returns the sha256 of what was written.
  Sha256::Digest sync() {
    if (!digest_) {
      file_.sync();
      digest_ = hash_.finish();
    }
    return *digest_;
  }

  // Synced, renamed into place, the folder synced (unless the caller syncs it after more renames).
  Sha256::Digest commit(bool sync_folder = true) {
    const auto digest = sync();
    file_.commit(sync_folder);
    return digest;
  }

private:
  core::AtomicFile file_;
  Sha256 hash_;
  std::optional<Sha256::Digest> digest_;  // once synced
};

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

// ---- layout of the parts

std::string step_folder(std::int64_t step) { return fmt::format("step-{:08}", step); }

std::string part_path(std::int64_t step, int part, int parts) {
  return fmt::format("{}/part-{:05}-of-{:05}.bin", step_folder(step), part, parts);
}

// A segment's sha256 covers its label, then its bytes (checkpoint.hpp), so that a range moved to
// another place in the index, or given another tensor's name, no longer matches.
Sha256 segment_hash(const CheckpointSegment& s) {
  const std::string label =
      fmt::format("shardplan.checkpoint segment {} {} {} {}\n", s.tensor, s.unit, s.begin, s.end);
  Sha256 hash;
  hash.update(label.data(), label.size());
  return hash;
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

struct Held {
  std::span<float> values;  // elements [begin, begin + values.size()) of the unit
  std::int64_t begin = 0;
};

Held held(const ShardingEngine::UnitState& st, std::string_view tensor) {
  if (tensor == "params") return {st.params, st.params_begin};
  return {tensor == "exp_avg" ? st.exp_avg : st.exp_avg_sq, st.optimizer_begin};
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

// ---- reading the index

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool is_inside(const std::string& path) {
  const fs::path p(path);
  // A NUL would end the path at open(2): "g/\0.." names "g/".
  if (path.empty() || p.is_absolute() || path.find('\0') != std::string::npos) return false;
  return std::none_of(p.begin(), p.end(), [](const fs::path& part) { return part == ".."; });
}

// (tensor, unit) -> the element ranges the files hold, to check that they tile each tensor.
using TensorRanges = std::map<std::pair<std::string, std::int64_t>,
                              std::vector<std::pair<std::int64_t, std::int64_t>>>;

// schema_version, kind, step, byte_order and dtypes.
void read_index_header(ObjectReader& r, CheckpointIndex& idx) {
  if (const auto v = r.integer("schema_version"); v != kSchemaVersion)
    throw InputError("/schema_version",
                     v == 1 ? "1, a checkpoint without the digests of its index and ranges, which "
                              "this executor no longer reads (it needs 2)"
                            : fmt::format("must be {}, got {}", kSchemaVersion, v));
  if (const auto kind = r.string("kind"); kind != "shardplan.checkpoint")
    throw InputError("/kind", fmt::format("must be \"shardplan.checkpoint\", got \"{}\"", kind));
  idx.step = r.integer("step", Range::between(0, static_cast<double>(kMaxCheckpointStep)));
  // The engine counts one step for both: AdamW's bias corrections and the data stream.
  if (const auto adamw = r.integer("adamw_step", Range::non_negative()); adamw != idx.step)
    throw InputError("/adamw_step", fmt::format("must equal /step ({}), got {}", idx.step, adamw));
  r.choice("byte_order", {"little"});
  ObjectReader d(r.object("dtypes"), "/dtypes");
  for (const char* t : kTensors) d.choice(t, {"f32"});
  d.finish();
}

// saved_by and model, and the elements of each of the model's units.
void read_index_model(ObjectReader& r, CheckpointIndex& idx) {
  idx.saved_by = r.object("saved_by");  // what saved it: a resume may use any plan
  idx.model = r.object("model");
  ObjectReader m(idx.model, "/model");
  const auto& units = m.array("units");
  if (units.empty()) throw InputError("/model/units", "no units");
  for (std::size_t u = 0; u < units.size(); ++u) {
    ObjectReader ur(units[u], fmt::format("/model/units/{}", u));
    ur.choice("kind", {"embedding", "block", "head"});
    idx.unit_elements.push_back(ur.integer("elements", Range::between(1, 1e15)));
    ur.finish();
  }
  m.ignore_if([](const std::string&) { return true; });  // compared with the run's model later
}

// One segment of a file, stored at `offset` (the bytes of the segments before it).
CheckpointSegment parse_segment(const json& doc, const std::string& sat,
                                const std::vector<std::int64_t>& unit_elements,
                                std::int64_t offset) {
  const auto units = static_cast<std::int64_t>(unit_elements.size());
  ObjectReader sr(doc, sat);
  CheckpointSegment s;
  s.tensor = sr.choice("tensor", {kTensors.begin(), kTensors.end()});
  s.unit = sr.integer("unit", Range::between(0, static_cast<double>(units - 1)));
  const auto n = unit_elements[static_cast<std::size_t>(s.unit)];
  s.begin = sr.integer("begin", Range::between(0, static_cast<double>(n - 1)));
  s.end =
      sr.integer("end", Range::between(static_cast<double>(s.begin + 1), static_cast<double>(n)));
  s.offset_bytes = sr.integer("offset_bytes", Range::non_negative());
  if (s.offset_bytes != offset)
    throw InputError(sat + "/offset_bytes",
                     fmt::format("must be {} (the segments are stored back to back), got {}",
                                 offset, s.offset_bytes));
  s.sha256 = sr.string("sha256");
  if (!is_sha256_hex(s.sha256))
    throw InputError(sat + "/sha256",
                     fmt::format("must be 64 lowercase hex digits, got \"{}\"", s.sha256));
  sr.finish();
  if ((s.end - s.begin) * kFloat > kMaxFileBytes - offset)
    throw InputError(sat + "/end", fmt::format("the file's segments pass {} bytes, got {}",
                                               kMaxFileBytes, s.end));
  return s;
}

CheckpointFile parse_file(const json& doc, const std::string& at,
                          const std::vector<std::int64_t>& unit_elements, TensorRanges& ranges) {
  ObjectReader fr(doc, at);
  CheckpointFile f;
  f.path = fr.string("path");
  if (!is_inside(f.path))
    throw InputError(at + "/path",
                     fmt::format("must be a relative path inside the checkpoint, got \"{}\"",
                                 core::printable(f.path)));
  f.bytes = fr.integer("bytes", Range::non_negative());
  f.sha256 = fr.string("sha256");
  if (!is_sha256_hex(f.sha256))
    throw InputError(at + "/sha256",
                     fmt::format("must be 64 lowercase hex digits, got \"{}\"", f.sha256));
  const auto& segments = fr.array("segments");
  std::int64_t offset = 0;
  for (std::size_t j = 0; j < segments.size(); ++j) {
    const auto s =
        parse_segment(segments[j], fmt::format("{}/segments/{}", at, j), unit_elements, offset);
    offset += (s.end - s.begin) * kFloat;
    ranges[{s.tensor, s.unit}].emplace_back(s.begin, s.end);
    f.segments.push_back(s);
  }
  if (offset != f.bytes)
    throw InputError(at + "/bytes",
                     fmt::format("{}, but the segments hold {} bytes", f.bytes, offset));
  fr.finish();
  return f;
}

// Every element of every tensor of every unit in exactly one file.
void check_tiling(TensorRanges& ranges, const std::vector<std::int64_t>& unit_elements) {
  const auto units = static_cast<std::int64_t>(unit_elements.size());
  for (const char* t : kTensors)
    for (std::int64_t u = 0; u < units; ++u) {
      auto& v = ranges[{t, u}];
      std::sort(v.begin(), v.end());
      std::int64_t next = 0;
      for (const auto& [b, e] : v) {
        if (b != next)
          throw InputError("/files", fmt::format("{} of unit {}: elements [{}, {}) are {}", t, u,
                                                 std::min(b, next), std::max(b, next),
                                                 b > next ? "in no file" : "in two files"));
        next = e;
      }
      const auto n = unit_elements[static_cast<std::size_t>(u)];
      if (next != n)
        throw InputError("/files", fmt::format("{} of unit {}: elements [{}, {}) are in no file", t,
                                               u, next, n));
    }
}

CheckpointIndex parse_index(const json& doc) {
  ObjectReader r(doc, "");
  CheckpointIndex idx;
  read_index_header(r, idx);
  read_index_model(r, idx);
  const auto& files = r.array("files");
  if (files.empty()) throw InputError("/files", "no files");
  TensorRanges ranges;
  for (std::size_t i = 0; i < files.size(); ++i)
    idx.files.push_back(
        parse_file(files[i], fmt::format("/files/{}", i), idx.unit_elements, ranges));
  r.finish();
  check_tiling(ranges, idx.unit_elements);
  return idx;
}

std::string index_path(const std::string& dir) { return (fs::path(dir) / kIndex).string(); }

// The digest file's one line, as sha256sum writes it: 64 hex digits, two spaces, index.json.
std::string digest_line(const Sha256::Digest& d) { return Sha256::hex(d) + "  " + kIndex + "\n"; }

CheckpointIndex read_index_in(int dirfd, const std::string& dir, bool step_copy = false);

// Whether `text`, DIR's index that its digest file does not match, is byte for byte the copy in
// the folder of the step it names, whose own digest matches it: a save cut short between renaming
// DIR's index and its digest (write_index), not an edit.
bool is_saved_step_copy(int dirfd, const std::string& dir, const std::string& text) {
  try {
    const auto step = parse_index(core::parse_json_text(text, dir)).step;
    const std::string folder = step_folder(step);
    const Fd fd(::openat(dirfd, folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return false;
    const auto shown = (fs::path(dir) / folder).string();
    read_index_in(fd.get(), shown, true);  // its digest matches
    return read_own_file(fd.get(), kIndex, index_path(shown), kMaxIndexBytes) == text;
  } catch (const InputError&) {
    return false;
  }
}

// The index in the folder `dirfd` (DIR, or a step folder holding its copy), named `dir` in errors:
// its digest file first, then the index it vouches for, strictly.
CheckpointIndex read_index_in(int dirfd, const std::string& dir, bool step_copy) {
  const std::string path = index_path(dir), digest_path = path + ".sha256";
  const std::string text = read_own_file(dirfd, kIndex, path, kMaxIndexBytes);
  auto parsed = [&] {
    const json doc = core::parse_json_text(text, path);
    try {
      return parse_index(doc);
    } catch (const InputError& e) {
      throw InputError(path, e.what());
    }
  };
  struct stat st {};
  if (::fstatat(dirfd, kIndexDigest, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
    parsed();  // an index of another version says so
    throw InputError(digest_path, "missing: the digest of index.json, written beside it");
  }
  const std::string line = read_own_file(dirfd, kIndexDigest, digest_path, kMaxIndexDigestBytes);
  const std::string recorded = line.substr(0, 64);
  if (!is_sha256_hex(recorded) || line != recorded + "  " + kIndex + "\n")
    throw InputError(digest_path,
                     fmt::format("must be one line \"<sha256>  {}\" as sha256sum writes it, got "
                                 "{}",
                                 kIndex, core::describe_value(line)));
  if (const auto got = Sha256::hex(Sha256::of(text));
      got != recorded && (step_copy || !is_saved_step_copy(dirfd, dir, text)))
    throw InputError(path, fmt::format("its sha256 is {}, {} says {}: the index was changed "
                                       "after it was saved",
                                       got, kIndexDigest, recorded));
  return parsed();
}

std::string file_path(const std::string& dir, const CheckpointFile& f) {
  return (fs::path(dir) / f.path).string();
}

void check_size(const std::string& dir, const CheckpointFile& f) {
  const std::string path = file_path(dir, f);
  std::error_code ec;
  const auto size = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) throw InputError(path, fmt::format("cannot read: {}", ec.message()));
  if (size < f.bytes)
    throw InputError(path, fmt::format("truncated: {} bytes, the index says {}", size, f.bytes));
  if (size > f.bytes)
    throw InputError(path, fmt::format("{} bytes, the index says {}", size, f.bytes));
}

// The first place where the checkpoint's model shape differs from the run's, as an error.
void compare_shape(const json& saved, const json& run, const std::string& pointer) {
  auto differ = [&](const std::string& what) {
    throw InputError(pointer, what + " (a checkpoint of another model)");
  };
  if (run.is_object() && saved.is_object()) {
    for (auto it = run.begin(); it != run.end(); ++it) {
      if (pointer == "/model" && it.key() == "name")
        continue;  // the same shape under another name (a preset, its config.json) is the same
      if (!saved.contains(it.key())) throw InputError(pointer + "/" + it.key(), "missing");
      compare_shape(saved[it.key()], it.value(), pointer + "/" + it.key());
    }
    for (auto it = saved.begin(); it != saved.end(); ++it)
      if (!run.contains(it.key())) throw InputError(pointer + "/" + it.key(), "unknown key");
    return;
  }
  if (run.is_array() && saved.is_array()) {
    if (run.size() != saved.size())
      differ(fmt::format("the checkpoint has {} entries, the run's model {}", saved.size(),
                         run.size()));
    for (std::size_t i = 0; i < run.size(); ++i)
      compare_shape(saved[i], run[i], fmt::format("{}/{}", pointer, i));
    return;
  }
  if (saved != run)
    differ(fmt::format("the checkpoint's model has {}, the run's model {}",
                       core::describe_value(saved), core::describe_value(run)));
}

std::int64_t read_ranges(ShardingEngine& engine, const std::string& dir,
                         const CheckpointIndex& index) {
  std::map<std::size_t, Fd> open;
  std::int64_t bytes = 0;
  for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u) {
    const auto st = engine.unit_state(u);
    const auto n = index.unit_elements[static_cast<std::size_t>(u)];
    for (const char* tensor : kTensors) {
      const Held h = held(st, tensor);
      std::fill(h.values.begin(), h.values.end(), 0.0f);  // padding stays zero
      const std::int64_t need_begin = h.begin;
      const std::int64_t need_end =
          std::min(h.begin + static_cast<std::int64_t>(h.values.size()), n);
      for (std::size_t k = 0; k < index.files.size(); ++k) {
        const auto& f = index.files[k];
        for (const auto& seg : f.segments) {
          if (seg.unit != u || seg.tensor != tensor) continue;
          const std::int64_t lo = std::max(need_begin, seg.begin), hi = std::min(need_end, seg.end);
          if (lo >= hi) continue;
          auto it = open.find(k);
          if (it == open.end()) it = open.emplace(k, open_for_reading(file_path(dir, f))).first;
          read_at(it->second.get(), h.values.data() + (lo - h.begin),
                  static_cast<std::size_t>((hi - lo) * kFloat),
                  seg.offset_bytes + (lo - seg.begin) * kFloat, file_path(dir, f));
          bytes += (hi - lo) * kFloat;
        }
      }
    }
  }
  return bytes;
}

// ---- saving: the folders

// A step folder absent, or a folder of its own: a symbolic link there would send the parts
// elsewhere.
void check_step_folder(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw InputError(path.string(), fmt::format("cannot read: {}", errno_text()));
  }
  if (S_ISLNK(st.st_mode))
    throw InputError(path.string(), "a symbolic link: a checkpoint writes its parts only into "
                                    "folders of its own");
  if (!S_ISDIR(st.st_mode)) throw InputError(path.string(), "exists and is not a folder");
}

void make_step_folder(const fs::path& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  if (errno != EEXIST)
    throw InputError(path.string(), fmt::format("cannot make the folder: {}", errno_text()));
  check_step_folder(path);
}

// The index and its digest in `folder`: both written and synced under temporary names, then
// renamed, the index first, then the folder synced. A reader sees the previous pair or the new
// one; a save cut short between the two renames leaves the new index with the previous digest
// (read_index_in then takes the index for its step folder's copy, written before).
void write_index(const fs::path& folder, const std::string& text) {
  HashedFile index(folder / kIndex);
  index.write(text.data(), text.size());
  const std::string line = digest_line(index.sync());
  HashedFile digest(folder / kIndexDigest);
  digest.write(line.data(), line.size());
  digest.sync();
  index.commit(false);
  digest.commit();
}

// A step folder this format wrote, open, and the names of the files its index names in it.
struct OwnStepFolder {
  Fd fd;
  std::vector<std::string> files;
};

// Step folder `name` of DIR (open as `dirfd`) when it is one this format wrote for a step before
// `step`: it holds a copy of the index (digest and all) of the step its name says, and that index
// names files directly in it. Nothing otherwise: a symbolic link, a newer step, a folder without
// a valid index.
std::optional<OwnStepFolder> older_step_folder(int dirfd, const fs::path& root,
                                               const std::string& name, std::int64_t step) {
  static const std::regex kStepDir("step-([0-9]{8,18})");
  std::smatch m;
  if (!std::regex_match(name, m, kStepDir)) return std::nullopt;
  const std::int64_t older = std::stoll(m[1].str());
  if (older >= step || name != step_folder(older)) return std::nullopt;
  OwnStepFolder folder{
      Fd(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)), {}};
  if (folder.fd.get() < 0) return std::nullopt;
  try {
    const auto index = read_index_in(folder.fd.get(), (root / name).string(), true);
    if (index.step != older) return std::nullopt;
    for (const auto& f : index.files) {
      const fs::path p(f.path);
      if (p.parent_path() != fs::path(name) || !p.has_filename()) return std::nullopt;
      folder.files.push_back(p.filename().string());
    }
  } catch (const InputError&) {
    return std::nullopt;
  }
  return folder;
}

// Removes a regular file (never what a symbolic link points to).
void remove_own_file(int dirfd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
    ::unlinkat(dirfd, name.c_str(), 0);
}

// The names in `folder` of the temporaries that a save cut short left for the files `own`
// (core::temporary_prefix).
std::vector<std::string> leftover_temporaries(const fs::path& folder,
                                              const std::vector<std::string>& own) {
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    for (const auto& name : own)
      if (entry.starts_with(core::temporary_prefix(name))) {
        found.push_back(entry);
        break;
      }
  }
  return found;
}

// Once step `step`'s index is in place: the folders of older steps that this format wrote go,
// each with only the files its index names, then the index, then the folder if that left it
// empty (a user's notes in it stay, and so does the folder). Best effort: what stays does no
// harm.
void remove_older_steps(const fs::path& root, std::int64_t step) {
  const Fd dirfd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dirfd.get() < 0) return;
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  for (const auto& name : names) {
    const auto folder = older_step_folder(dirfd.get(), root, name, step);
    if (!folder) continue;
    std::vector<std::string> own = folder->files;
    own.insert(own.end(), {kIndex, kIndexDigest});
    for (const auto& f : leftover_temporaries(root / name, own))
      remove_own_file(folder->fd.get(), f);
    for (const auto& f : own) remove_own_file(folder->fd.get(), f);
    ::unlinkat(dirfd.get(), name.c_str(), AT_REMOVEDIR);  // fails, harmlessly, when not empty
  }
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

CheckpointIndex checkpoint_index_from_json(const json& doc) { return parse_index(doc); }

CheckpointIndex read_checkpoint_index(const std::string& dir) {
  const Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw InputError(index_path(dir), fmt::format("cannot read: {}", errno_text()));
  return read_index_in(fd.get(), dir);
}

void verify_checkpoint_file(const std::string& dir, const CheckpointFile& f) {
  check_size(dir, f);
  const std::string path = file_path(dir, f);
  const Fd fd = open_for_reading(path);
  // The segments lie back to back from byte 0 and fill the file (parse_index): one pass hashes
  // the file and each segment.
  Sha256 hash;
  std::vector<std::string> segment_digests;
  std::vector<char> block(kIoBlock);
  for (const auto& seg : f.segments) {
    auto seg_hash = segment_hash(seg);
    const std::int64_t end = seg.offset_bytes + (seg.end - seg.begin) * kFloat;
    for (std::int64_t at = seg.offset_bytes; at < end;) {
      const auto n = static_cast<std::size_t>(std::min<std::int64_t>(kIoBlock, end - at));
      read_at(fd.get(), block.data(), n, at, path);
      hash.update(block.data(), n);
      seg_hash.update(block.data(), n);
      at += static_cast<std::int64_t>(n);
    }
    segment_digests.push_back(Sha256::hex(seg_hash.finish()));
  }
  if (const auto got = Sha256::hex(hash.finish()); got != f.sha256)
    throw InputError(path,
                     fmt::format("corrupted: its sha256 is {}, the index says {}", got, f.sha256));
  // The file is the one the index names, byte for byte: a segment that does not match is a label
  // or a range the index gives to bytes that are not it.
  for (std::size_t j = 0; j < f.segments.size(); ++j)
    if (const auto& seg = f.segments[j]; segment_digests[j] != seg.sha256)
      throw InputError(path,
                       fmt::format("bytes [{}, {}) are not {} of unit {}, elements [{}, {}), "
                                   "as the index says: their sha256 with that label is {}, "
                                   "the index says {}",
                                   seg.offset_bytes,
                                   seg.offset_bytes + (seg.end - seg.begin) * kFloat, seg.tensor,
                                   seg.unit, seg.begin, seg.end, segment_digests[j], seg.sha256));
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
