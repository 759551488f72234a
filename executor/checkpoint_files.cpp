// The files a checkpoint reads: positioned reads through a descriptor, and the small files this
// format writes (an index, its digest) read whole, strictly. The classes Fd and HashedFile are in
// checkpoint_format.hpp.
#include "executor/checkpoint_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/file_kind.hpp"

namespace shardplan::executor::checkpoint_format {

std::string errno_text() { return std::strerror(errno); }

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

}  // namespace shardplan::executor::checkpoint_format
