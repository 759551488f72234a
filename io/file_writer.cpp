#include "io/file_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>

#include <fmt/format.h>

#include "costmodel/input_error.hpp"
#include "io/file_kind.hpp"
#include "io/text.hpp"

namespace shardplan::io {
namespace {

using costmodel::InputError;

[[noreturn]] void fail(const std::string& path, const std::string& flag,
                       const std::string& reason) {
  if (flag.empty())
    throw InputError(printable(path), fmt::format("cannot write: {}", reason));
  throw InputError(flag, fmt::format("cannot write \"{}\": {}", printable(path), reason));
}

std::string errno_text() { return std::strerror(errno); }

// How a path is written (the file's comment).
enum class Way { standard_output, through, replace };

struct Target {
  Way way = Way::replace;
  std::string folder;    // replace: where the temporary goes
  std::string name;      // replace: the file's name in it
  int keep_mode = -1;    // replace: an existing file's permission bits, or -1
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
        fail(path, flag, fmt::format("it is a symbolic link to nothing ({}); links are followed "
                                     "only to a device, FIFO or socket",
                                     errno_text()));
      if (!written_through(to.st_mode))
        fail(path, flag, fmt::format("it is a symbolic link to {}; links are followed only to a "
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
  t.name = p.filename().string();
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

// A new file beside the target, created O_EXCL under a name no other process or call uses:
// ".NAME.tmp-PID-RANDOM" (NAME cut so that the whole stays within a file name's 255 bytes).
class Temporary {
public:
  Temporary(const Target& t, const std::string& path, const std::string& flag) {
    std::random_device entropy;
    const std::string name = t.name.substr(0, 200);
    for (int attempt = 0; fd_ < 0; ++attempt) {
      const auto salt = (std::uint64_t{entropy()} << 32) | entropy();
      path_ = (std::filesystem::path(t.folder) /
               fmt::format(".{}.tmp-{}-{:016x}", name, static_cast<long>(::getpid()), salt))
                  .string();
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (fd_ < 0 && (errno != EEXIST || attempt == 100)) fail(path, flag, errno_text());
    }
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  ~Temporary() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  // Closes the file, reporting the close's error (a file system may report a write's only there).
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  const std::string& path() const { return path_; }
  void renamed() { renamed_ = true; }

private:
  std::string path_;
  int fd_ = -1;
  bool renamed_ = false;
};

void replace(const Target& t, const std::string& path, std::string_view bytes,
             const std::string& flag) {
  Temporary tmp(t, path, flag);
  if (t.keep_mode >= 0) ::fchmod(tmp.fd(), static_cast<mode_t>(t.keep_mode)); // best effort
  write_all(tmp.fd(), bytes, path, flag);
  // EINVAL: a file system without fsync; its bytes are as durable as it makes them.
  if (::fsync(tmp.fd()) != 0 && errno != EINVAL) fail(path, flag, errno_text());
  if (tmp.close() != 0) fail(path, flag, errno_text());
  if (::rename(tmp.path().c_str(), path.c_str()) != 0) fail(path, flag, errno_text());
  tmp.renamed();
  // The rename reaches the disk with the folder's fsync; the file is in place either way.
  const int dir = ::open(t.folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

} // namespace

void write_file(const std::string& path, std::string_view bytes, const std::string& flag) {
  const Target t = target_of(path, flag);
  switch (t.way) {
  case Way::standard_output: write_standard_output(bytes, flag); return;
  case Way::through: write_through(path, bytes, flag); return;
  case Way::replace: replace(t, path, bytes, flag); return;
  }
}

void check_destination(const std::string& path, const std::string& flag) {
  const Target t = target_of(path, flag);
  if (t.way != Way::replace) return;
  struct stat st {};
  if (::stat(t.folder.c_str(), &st) != 0) fail(path, flag, errno_text());
  if (!S_ISDIR(st.st_mode)) fail(path, flag, std::strerror(ENOTDIR));
  const Temporary probe(t, path, flag); // removed again at once
}

} // namespace shardplan::io
