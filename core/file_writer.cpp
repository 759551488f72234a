#include "core/file_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "core/atomic_file.hpp"
#include "core/file_kind.hpp"
#include "core/input_error.hpp"
#include "core/text.hpp"

namespace shardplan::core {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& flag,
                       const std::string& reason) {
  cannot_write(path, flag, reason);
}

// How a path is written (the file's comment).
enum class Way { standard_output, through, replace };

struct Target {
  Way way = Way::replace;
  std::string folder;  // replace: where the temporary goes
  int keep_mode = -1;  // replace: an existing file's permission bits, or -1
};

bool written_through(mode_t mode) { return S_ISCHR(mode) || S_ISFIFO(mode) || S_ISSOCK(mode); }

Target target_of(const std::string& path, const std::string& flag) {
  Target t;
  if (path == "-") {
    t.way = Way::standard_output;
    return t;
  }
  if (path.empty()) fail(path, flag, "the path is empty");
  if (path.find('\0') != std::string::npos) fail(path, flag, "a path cannot hold a NUL byte");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      struct stat to {};
      if (::stat(path.c_str(), &to) != 0)
        fail(path, flag,
             fmt::format("it is a symbolic link to nothing ({}); links are followed "
                         "only to a device, FIFO or socket",
                         errno_text()));
      if (!written_through(to.st_mode))
        fail(path, flag,
             fmt::format("it is a symbolic link to {}; links are followed only to a "
                         "device, FIFO or socket: give the target's own path",
                         file_kind(to.st_mode)));
      t.way = Way::through;
      return t;
    }
    if (written_through(st.st_mode)) {
      t.way = Way::through;
      return t;
    }
    if (!S_ISREG(st.st_mode)) fail(path, flag, fmt::format("it is {}", file_kind(st.st_mode)));
    t.keep_mode = static_cast<int>(st.st_mode & 0777);
  } else if (errno != ENOENT) {
    fail(path, flag, errno_text());
  }
  const std::filesystem::path p(path);
  t.folder = p.has_parent_path() ? p.parent_path().string() : ".";
  return t;
}

void write_all(int fd, std::string_view bytes, const std::string& path, const std::string& flag) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, flag, errno_text());
    if (n == 0) fail(path, flag, "the write made no progress");
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void write_standard_output(std::string_view bytes, const std::string& flag) {
  errno = 0;
  std::cout.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::cout.flush();
  if (!std::cout) fail("-", flag, errno != 0 ? errno_text() : "the write failed");
}

void write_through(const std::string& path, std::string_view bytes, const std::string& flag) {
  // No O_CREAT or O_TRUNC: what is there is written to, never made or replaced.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) fail(path, flag, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !written_through(st.st_mode)) {
    ::close(fd);
    fail(path, flag, "it changed from a device or FIFO while it was opened");
  }
  try {
    write_all(fd, bytes, path, flag);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail(path, flag, errno_text());
}

void replace(const Target& t, const std::string& path, std::string_view bytes,
             const std::string& flag) {
  AtomicFile file(path, flag, t.keep_mode);
  file.write(bytes);
  file.commit();
}

}  // namespace

void write_file(const std::string& path, std::string_view bytes, const std::string& flag) {
  const Target t = target_of(path, flag);
  switch (t.way) {
  case Way::standard_output:
    write_standard_output(bytes, flag);
    return;
  case Way::through:
    write_through(path, bytes, flag);
    return;
  case Way::replace:
    replace(t, path, bytes, flag);
    return;
  }
}

void check_destination(const std::string& path, const std::string& flag) {
  const Target t = target_of(path, flag);
  if (t.way != Way::replace) return;
  struct stat st {};
  if (::stat(t.folder.c_str(), &st) != 0) fail(path, flag, errno_text());
  if (!S_ISDIR(st.st_mode)) fail(path, flag, std::strerror(ENOTDIR));
  const AtomicFile probe(path, flag);  // its temporary is removed again at once
}

}  // namespace shardplan::core
