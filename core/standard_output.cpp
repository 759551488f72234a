#include "core/standard_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <fmt/format.h>

namespace shardplan::core {

int finish_standard_output(std::string_view program, int exit_code) {
  // A write that failed earlier left errno with its reason (nothing since has failed).
  bool failed = std::cout.fail() || std::ferror(stdout) != 0;
  int error = failed ? errno : 0;
  if (!failed) {
    errno = 0;
    std::cout.flush();  // its own buffer, if it has one, into C's stdout
    const bool flushed = std::fflush(stdout) == 0;
    failed = !flushed || std::cout.fail() || std::ferror(stdout) != 0;
    error = errno;
  }
  if (!failed) {
    // Some file systems report a failed write only when the file is closed (NFS writes back then);
    // closing a duplicate asks, and leaves descriptor 1 open for whatever runs at exit.
    const int fd = ::dup(STDOUT_FILENO);
    if (fd >= 0 && ::close(fd) != 0) {
      failed = true;
      error = errno;
    }
  }
  if (!failed || exit_code != 0) return exit_code;
  const std::string reason = error != 0 ? std::strerror(error) : "a write failed";
  std::fputs(fmt::format("{}: standard output: cannot write: {}\n", program, reason).c_str(),
             stderr);
  return 2;
}

}  // namespace shardplan::core
