#include "core/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/file_kind.hpp"
#include "core/input_error.hpp"
#include "core/text.hpp"

namespace shardplan::core {
namespace {

using core::InputError;

class Fd {
public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

private:
  int fd_;
};

std::string size_text(std::int64_t bytes) {
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  return bytes % kMiB == 0 ? fmt::format("{} MiB ({} bytes)", bytes / kMiB, bytes)
                           : fmt::format("{} bytes", bytes);
}

[[noreturn]] void too_large(const std::string& shown, const std::string& size, std::int64_t limit) {
  throw InputError(shown, fmt::format("is {}the {} this file may have", size, size_text(limit)));
}

}  // namespace

std::string read_file(const std::string& path, std::int64_t limit_bytes) {
  const std::string shown = printable(path);
  if (path.find('\0') != std::string::npos)
    throw InputError(shown, "a path cannot hold a NUL byte");
  // O_NONBLOCK: opening a FIFO does not wait for a writer (its type refuses it below); a regular
  // file reads the same with it.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0)
    throw InputError(shown, fmt::format("cannot open file: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw InputError(shown, fmt::format("cannot read: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw InputError(shown, fmt::format("is {}, not a regular file", file_kind(st.st_mode)));
  if (st.st_size > limit_bytes)
    too_large(shown, fmt::format("{} bytes, more than ", st.st_size), limit_bytes);

  // The size may change while it is read (or be 0, as in /proc): the bound holds for what is read.
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char block[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(shown, fmt::format("cannot read: {}", std::strerror(errno)));
    if (n == 0) break;
    if (static_cast<std::int64_t>(text.size()) + n > limit_bytes)
      too_large(shown, "more than ", limit_bytes);
    text.append(block, static_cast<std::size_t>(n));
  }
  return text;
}

}  // namespace shardplan::core
