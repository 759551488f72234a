#include "executor/checkpoint_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "comm/process_identity.hpp"
#include "core/input_error.hpp"

namespace shardplan::executor {
namespace {

namespace fs = std::filesystem;
using core::InputError;

constexpr const char* kLockFile = ".lock";

// "pid N on host H" from what the holder wrote ("N H\n"), or what stands in for it.
std::string holder_of(int fd, const std::string& lock_path) {
  std::array<char, 512> text{};
  const ssize_t n = ::pread(fd, text.data(), text.size() - 1, 0);
  std::istringstream in(std::string(text.data(), n > 0 ? static_cast<std::size_t>(n) : 0));
  long long pid = 0;
  std::string host;
  if (in >> pid >> host && pid > 0) return fmt::format("pid {} on host {}", pid, host);
  return fmt::format("another process ({} names none yet)", lock_path);
}

}  // namespace

CheckpointLock::CheckpointLock(CheckpointLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

CheckpointLock& CheckpointLock::operator=(CheckpointLock&& o) noexcept {
  std::swap(fd_, o.fd_);
  return *this;
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

CheckpointLock CheckpointLock::take(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw InputError("--save", fmt::format("cannot make the folder \"{}\": {}", dir, ec.message()));
  const std::string path = (fs::path(dir) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  // O_NOFOLLOW answers a link with ELOOP ("Too many levels of symbolic links"): said as what it is.
  if (fd < 0 && errno == ELOOP)
    throw InputError("--save", fmt::format("\"{}\" is a symbolic link; the lock file is never "
                                           "followed through one (remove it)",
                                           path));
  if (fd < 0)
    throw InputError("--save",
                     fmt::format("cannot write in \"{}\": {}", dir, std::strerror(errno)));
  CheckpointLock lock(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw InputError("--save", fmt::format("\"{}\" is not a regular file", path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      throw InputError("--save",
                       fmt::format("\"{}\" is being written by {}", dir, holder_of(fd, path)));
    throw InputError("--save", fmt::format("cannot lock \"{}\": {}", path, std::strerror(errno)));
  }
  const std::string holder = fmt::format("{} {}\n", ::getpid(), comm::host_name());
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size()))
    throw InputError("--save", fmt::format("cannot write \"{}\": {}", path, std::strerror(errno)));
  return lock;
}

}  // namespace shardplan::executor
