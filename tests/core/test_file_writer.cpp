#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>  // ::signal, SIGXFSZ (POSIX's <signal.h>)
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "scratch.hpp"
#include "tests/test_support.hpp"

using shardplan::core::check_destination;
using shardplan::core::InputError;
using shardplan::core::write_file;
using shardplan::core::test::read_text;
using shardplan::core::test::Scratch;
using shardplan::core::test::write_text;
using shardplan::test::error_of;

namespace {

mode_t lmode(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode;
}

// Runs f in a child process and returns its exit status (f's return value; 99 for an exception).
template <class F> int in_child(F&& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = f();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("file_writer::a new or existing regular file is replaced whole, no temporary left") {
  const Scratch s("replace");
  const std::string path = s.path("out.json");
  write_file(path, "first\n");
  CHECK(read_text(path) == "first\n");
  REQUIRE(::chmod(path.c_str(), 0640) == 0);
  write_file(path, "second\n");
  CHECK(read_text(path) == "second\n");
  CHECK((lmode(path) & 0777) == 0640);  // the file's permission bits are kept
  CHECK(s.names() == std::vector<std::string>{"out.json"});
}

TEST_CASE("file_writer::standard output is written through std::cout") {
  std::ostringstream captured;
  auto* old = std::cout.rdbuf(captured.rdbuf());
  write_file("-", "to stdout\n");
  std::cout.rdbuf(old);
  CHECK(captured.str() == "to stdout\n");
}

TEST_CASE("file_writer::a character device is written through and stays a device") {
  write_file("/dev/null", "nothing\n");
  CHECK(S_ISCHR(lmode("/dev/null")));
  CHECK_NOTHROW(check_destination("/dev/null", "--out"));
}

TEST_CASE("file_writer::a full device is an error with errno's text, and stays a device") {
  CHECK(error_of([] { write_file("/dev/full", "x", "--svg"); }) ==
        "--svg: cannot write \"/dev/full\": No space left on device");
  CHECK(S_ISCHR(lmode("/dev/full")));
}

TEST_CASE("file_writer::a FIFO is written through to its reader and stays a FIFO") {
  const Scratch s("fifo");
  const std::string fifo = s.path("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string got;
  std::thread reader([&] { got = read_text(fifo); });
  write_file(fifo, std::string(200'000, 'p'));  // more than a pipe holds: the reader drains it
  reader.join();
  CHECK(got == std::string(200'000, 'p'));
  CHECK(S_ISFIFO(lmode(fifo)));
  CHECK(s.names() == std::vector<std::string>{"pipe"});
}

TEST_CASE("file_writer::a symbolic link is followed to a device only, other links are refused") {
  const Scratch s("symlink");
  write_text(s.path("target.json"), "old");
  std::filesystem::create_symlink(s.path("target.json"), s.path("link.json"));
  const std::string refused = error_of([&] { write_file(s.path("link.json"), "new", "--out"); });
  CHECK(refused == "--out: cannot write \"" + s.path("link.json") +
                       "\": it is a symbolic link to a regular file; links are followed only to "
                       "a device, FIFO or socket: give the target's own path");
  CHECK(error_of([&] { check_destination(s.path("link.json"), "--out"); }) == refused);
  CHECK(S_ISLNK(lmode(s.path("link.json"))));
  CHECK(read_text(s.path("target.json")) == "old");
  std::filesystem::create_symlink(s.path("nothing"), s.path("dangling.json"));
  CHECK(error_of([&] {
          write_file(s.path("dangling.json"), "new");
        }).find("it is a symbolic link to nothing (No such file or directory)") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(s.path("nothing")));
  std::filesystem::create_symlink("/dev/null", s.path("null"));
  write_file(s.path("null"), "through");
  CHECK(S_ISLNK(lmode(s.path("null"))));
  CHECK(S_ISCHR(lmode("/dev/null")));
  CHECK(s.names() == std::vector<std::string>{"dangling.json", "link.json", "null", "target.json"});
}

TEST_CASE("file_writer::a directory, a missing folder, a file as a folder are refused") {
  const Scratch s("refused");
  CHECK(error_of([&] { write_file(s.dir().string(), "x"); }) ==
        s.dir().string() + ": cannot write: it is a directory");
  CHECK(error_of([&] { check_destination(s.path("no/such/run.json"), "--out"); }) ==
        "--out: cannot write \"" + s.path("no/such/run.json") + "\": No such file or directory");
  CHECK(error_of([&] { write_file(s.path("no/such/run.json"), "x"); }) ==
        s.path("no/such/run.json") + ": cannot write: No such file or directory");
  write_text(s.path("file"), "");
  CHECK(error_of([&] { check_destination(s.path("file/run.json")); }) ==
        s.path("file/run.json") + ": cannot write: Not a directory");
  CHECK(s.names() == std::vector<std::string>{"file"});
}

TEST_CASE("file_writer::check_destination creates nothing that stays") {
  const Scratch s("check");
  CHECK_NOTHROW(check_destination(s.path("run.json"), "--out"));
  CHECK_NOTHROW(check_destination("-", "--out"));
  write_text(s.path("old.json"), "kept");
  CHECK_NOTHROW(check_destination(s.path("old.json"), "--out"));
  CHECK(read_text(s.path("old.json")) == "kept");
  CHECK(s.names() == std::vector<std::string>{"old.json"});
}

TEST_CASE("file_writer::a read-only folder is refused before and at the write") {
  if (::geteuid() == 0) {
    MESSAGE("skipped: permissions do not stop root's writes");
    return;
  }
  const Scratch s("read-only");
  std::filesystem::create_directory(s.path("ro"));
  std::filesystem::permissions(s.path("ro"), std::filesystem::perms::owner_read |
                                                 std::filesystem::perms::owner_exec);
  CHECK(error_of([&] { check_destination(s.path("ro/run.json"), "--out"); }) ==
        "--out: cannot write \"" + s.path("ro/run.json") + "\": Permission denied");
  CHECK(error_of([&] { write_file(s.path("ro/run.json"), "x", "--out"); }) ==
        "--out: cannot write \"" + s.path("ro/run.json") + "\": Permission denied");
}

TEST_CASE("file_writer::a write that fails midway leaves the old file and no temporary") {
  const Scratch s("midway");
  const std::string path = s.path("m.svg");
  write_text(path, "old");
  // A file size limit makes the write fail with EFBIG (the signal it would raise ignored).
  const int code = in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    const auto e = error_of([&] { write_file(path, std::string(100'000, 's'), "--svg"); });
    return e == "--svg: cannot write \"" + path + "\": File too large" ? 0 : 1;
  });
  CHECK(code == 0);
  CHECK(read_text(path) == "old");
  CHECK(s.names() == std::vector<std::string>{"m.svg"});
}

TEST_CASE("file_writer::processes writing one path at once each write it whole") {
  const Scratch s("concurrent");
  const std::string path = s.path("same.svg");
  constexpr int kProcesses = 12, kWrites = 8;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        for (int w = 0; w < kWrites; ++w)
          write_file(path, std::string(std::size_t{64} * 1024, static_cast<char>('a' + p)));
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  CHECK(failed == 0);
  const std::string got = read_text(path);
  REQUIRE(got.size() == 64 * 1024);
  CHECK(got == std::string(got.size(), got.front()));  // one writer's bytes, whole
  CHECK(s.names() == std::vector<std::string>{"same.svg"});
}
