// The checkpoint's format, shared by the checkpoint's parts (checkpoint.cpp, checkpoint_files.cpp,
// checkpoint_index.cpp, checkpoint_folders.cpp): its constants, its file handles and the helpers
// that more than one part uses. Not the executor's interface: that is checkpoint.hpp.
#pragma once

#include <unistd.h>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/atomic_file.hpp"
#include "core/input_error.hpp"
#include "executor/checkpoint.hpp"
#include "executor/sha256.hpp"

namespace shardplan::executor::checkpoint_format {

namespace fs = std::filesystem;
using core::InputError;
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

// ---- files (checkpoint_files.cpp)

std::string errno_text();

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

Fd open_for_reading(const std::string& path);
void read_at(int fd, void* data, std::size_t bytes, std::int64_t offset, const std::string& path);
std::string read_own_file(int dirfd, const char* name, const std::string& shown,
                          std::int64_t limit);

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

// ---- layout of the parts (checkpoint.cpp)

std::string step_folder(std::int64_t step);
Sha256 segment_hash(const CheckpointSegment& s);

struct Held {
  std::span<float> values;  // elements [begin, begin + values.size()) of the unit
  std::int64_t begin = 0;
};

Held held(const ShardingEngine::UnitState& st, std::string_view tensor);

// ---- reading the index (checkpoint_index.cpp)

std::string index_path(const std::string& dir);
std::string digest_line(const Sha256::Digest& d);
CheckpointIndex read_index_in(int dirfd, const std::string& dir, bool step_copy = false);
std::string file_path(const std::string& dir, const CheckpointFile& f);
void check_size(const std::string& dir, const CheckpointFile& f);
void compare_shape(const json& saved, const json& run, const std::string& pointer);
std::int64_t read_ranges(ShardingEngine& engine, const std::string& dir,
                         const CheckpointIndex& index);

// ---- saving: the folders (checkpoint_folders.cpp)

void check_step_folder(const fs::path& path);
void make_step_folder(const fs::path& path);
void write_index(const fs::path& folder, const std::string& text);
void remove_older_steps(const fs::path& root, std::int64_t step);

}  // namespace shardplan::executor::checkpoint_format
