#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "core/standard_output.hpp"
#include "scratch.hpp"

using shardplan::core::finish_standard_output;
using shardplan::core::test::read_text;
using shardplan::core::test::Scratch;

namespace {

struct Finished {
  int code = -1;
  std::string err;
};

// In a child process whose standard output is `out` and standard error a file: writes `text` to
// std::cout, then finishes standard output as main() does with exit code `code`.
Finished finish_in_child(const char* out, const std::string& text, int code, const Scratch& s) {
  const std::string err = s.path("stderr");
  std::cout.flush();
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out, O_WRONLY);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(99);
    std::cout << text;
    ::_exit(finish_standard_output("prog", code));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_text(err)};
}

}  // namespace

TEST_CASE("standard_output::a full device is exit code 2 and one line with the reason") {
  const Scratch s("full");
  const auto small = finish_in_child("/dev/full", "{}\n", 0, s);
  CHECK(small.code == 2);
  CHECK(small.err == "prog: standard output: cannot write: No space left on device\n");
  // More than stdio's buffer: the write fails before the flush.
  const auto large = finish_in_child("/dev/full", std::string(100'000, 'x'), 0, s);
  CHECK(large.code == 2);
  CHECK(large.err == "prog: standard output: cannot write: No space left on device\n");
  // A program that failed already keeps its code and its own line.
  const auto failed = finish_in_child("/dev/full", "x", 3, s);
  CHECK(failed.code == 3);
  CHECK(failed.err.empty());
}

TEST_CASE("standard_output::what reached its destination keeps exit code 0") {
  const Scratch s("fine");
  const auto fine = finish_in_child("/dev/null", std::string(100'000, 'x'), 0, s);
  CHECK(fine.code == 0);
  CHECK(fine.err.empty());
}
