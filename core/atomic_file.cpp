#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "core/text.hpp"

namespace shardplan::core {
std::string errno_text() { return std::strerror(errno); }

namespace {

// Room for ".tmp-PID-RANDOM" within a file name's 255 bytes.
constexpr std::size_t kNameBytes = 200;

}  // namespace

void cannot_write(const std::string& path, const std::string& flag, const std::string& reason) {
  if (flag.empty())
    throw core::InputError(printable(path), fmt::format("cannot write: {}", reason));
  throw core::InputError(flag, fmt::format("cannot write \"{}\": {}", printable(path), reason));
}

std::string temporary_prefix(std::string_view name) {
  return fmt::format(".{}.tmp-", name.substr(0, kNameBytes));
}

AtomicFile::AtomicFile(std::string path, std::string flag, int keep_mode)
    : path_(std::move(path)), flag_(std::move(flag)) {
  if (path_.empty()) cannot_write(path_, flag_, "the path is empty");
  if (path_.find('\0') != std::string::npos)
    cannot_write(path_, flag_, "a path cannot hold a NUL byte");
  const std::filesystem::path p(path_);
  if (!p.has_filename()) cannot_write(path_, flag_, std::strerror(EISDIR));
  folder_ = p.has_parent_path() ? p.parent_path().string() : ".";
  const std::string prefix = temporary_prefix(p.filename().string());
  std::random_device entropy;
  for (int attempt = 0; fd_ < 0; ++attempt) {
    const auto salt = (std::uint64_t{entropy()} << 32) | entropy();
    temporary_ = (std::filesystem::path(folder_) /
                  fmt::format("{}{}-{:016x}", prefix, static_cast<long>(::getpid()), salt))
                     .string();
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 100)) cannot_write(path_, flag_, errno_text());
  }
  if (keep_mode >= 0) ::fchmod(fd_, static_cast<mode_t>(keep_mode));  // best effort
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) cannot_write(path_, flag_, "the file was already synced");
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) cannot_write(path_, flag_, errno_text());
    if (n == 0) cannot_write(path_, flag_, "the write made no progress");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::sync() {
  if (fd_ < 0) return;
  // EINVAL: a file system without fsync; its bytes are as durable as it makes them.
  if (::fsync(fd_) != 0 && errno != EINVAL) cannot_write(path_, flag_, errno_text());
  // The close reports its error: a file system may report a write's only there.
  const int rc = ::close(std::exchange(fd_, -1));
  if (rc != 0) cannot_write(path_, flag_, errno_text());
}

void AtomicFile::commit(bool sync_folder_too) {
  if (committed_) return;
  sync();
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) cannot_write(path_, flag_, errno_text());
  committed_ = true;
  if (sync_folder_too) sync_folder(folder_, path_, flag_);
}

void sync_folder(const std::string& folder, const std::string& path, const std::string& flag) {
  const int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // EACCES: a folder that can be written but not read cannot be synced (no more than on a file
  // system without fsync); the file is in place.
  if (fd < 0 && errno == EACCES) return;
  if (fd < 0) cannot_write(path, flag, fmt::format("cannot sync the folder: {}", errno_text()));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL)
    cannot_write(path, flag, fmt::format("cannot sync the folder: {}", std::strerror(error)));
}

}  // namespace shardplan::core
