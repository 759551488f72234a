// Reading a checkpoint's index: its digest file, then the index strictly (the segments tile every
// tensor); the checks of a part (size, sha256s) and of the model's shape against the run's, and
// the reads of the ranges a rank holds.
#include "executor/checkpoint_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "core/text.hpp"
#include "kernels/adamw.hpp"

namespace shardplan::executor::checkpoint_format {

using kernels::adamw_step;

using core::ObjectReader;
using core::Range;

namespace {

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

}  // namespace

std::string index_path(const std::string& dir) { return (fs::path(dir) / kIndex).string(); }

// The digest file's one line, as sha256sum writes it: 64 hex digits, two spaces, index.json.
std::string digest_line(const Sha256::Digest& d) { return Sha256::hex(d) + "  " + kIndex + "\n"; }

namespace {

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

}  // namespace

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

}  // namespace shardplan::executor::checkpoint_format

namespace shardplan::executor {

using namespace checkpoint_format;

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

}  // namespace shardplan::executor
