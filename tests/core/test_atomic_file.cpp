#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>  // ::signal, SIGXFSZ (POSIX's <signal.h>)
#include <filesystem>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "scratch.hpp"
#include "tests/test_support.hpp"

using shardplan::core::AtomicFile;
using shardplan::core::sync_folder;
using shardplan::core::temporary_prefix;
using shardplan::core::test::read_text;
using shardplan::core::test::Scratch;
using shardplan::core::test::write_text;
using shardplan::test::error_of;

TEST_CASE("atomic_file::committed, the file holds every write and no temporary stays") {
  const Scratch s("atomic-commit");
  const std::string path = s.path("plan.json");
  write_text(path, "old");
  {
    AtomicFile file(path);
    // The temporary is in the file's folder, under the file's temporary prefix.
    const std::filesystem::path tmp(file.temporary_path());
    CHECK(tmp.parent_path() == s.dir());
    CHECK(tmp.filename().string().starts_with(temporary_prefix("plan.json")));
    CHECK(tmp.filename().string().starts_with(".plan.json.tmp-"));
    file.write("new ");
    file.write("bytes");
    CHECK(read_text(path) == "old");  // nothing in place before the commit
    file.commit();
  }
  CHECK(read_text(path) == "new bytes");
  CHECK(s.names() == std::vector<std::string>{"plan.json"});
}

TEST_CASE("atomic_file::without a commit the file is untouched and the temporary removed") {
  const Scratch s("atomic-abandon");
  const std::string path = s.path("index.json");
  write_text(path, "kept");
  {
    AtomicFile file(path);
    file.write("lost");
    file.sync();
    CHECK(s.names().size() == 2);
  }
  CHECK(read_text(path) == "kept");
  CHECK(s.names() == std::vector<std::string>{"index.json"});
}

TEST_CASE("atomic_file::a synced file takes no more writes and commit renames it once") {
  const Scratch s("atomic-synced");
  const std::string path = s.path("a.bin");
  AtomicFile file(path, "--out");
  file.write("x");
  file.sync();
  CHECK(error_of([&] { file.write("y"); }) ==
        "--out: cannot write \"" + path + "\": the file was already synced");
  file.commit(false);
  file.commit();  // a second commit does nothing
  CHECK(read_text(path) == "x");
}

TEST_CASE("atomic_file::an existing file's permission bits are kept when asked") {
  const Scratch s("atomic-mode");
  const std::string path = s.path("m.json");
  {
    AtomicFile file(path, {}, 0600);
    file.commit();
  }
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("atomic_file::paths that cannot be written are refused at construction") {
  const Scratch s("atomic-refused");
  CHECK(error_of([] { AtomicFile file(""); }) == ": cannot write: the path is empty");
  CHECK(error_of([] { AtomicFile file(std::string("a\0b", 3), "--out"); }) ==
        "--out: cannot write \"a\\x00b\": a path cannot hold a NUL byte");
  CHECK(error_of([&] { AtomicFile file(s.path("no/such/run.json"), "--out"); }) ==
        "--out: cannot write \"" + s.path("no/such/run.json") + "\": No such file or directory");
  write_text(s.path("file"), "");
  CHECK(error_of([&] { AtomicFile file(s.path("file/run.json")); }) ==
        s.path("file/run.json") + ": cannot write: Not a directory");
  CHECK(error_of([&] { AtomicFile file(s.path("dir/")); }) ==
        s.path("dir/") + ": cannot write: Is a directory");
  CHECK(s.names() == std::vector<std::string>{"file"});
}

TEST_CASE("atomic_file::a rename over a directory fails and removes the temporary") {
  const Scratch s("atomic-rename");
  std::filesystem::create_directory(s.path("taken"));
  write_text(s.path("taken/inside"), "");
  CHECK(error_of([&] {
          AtomicFile file(s.path("taken"));
          file.write("x");
          file.commit();
        }) == s.path("taken") + ": cannot write: Is a directory");
  CHECK(s.names() == std::vector<std::string>{"taken"});
}

TEST_CASE("atomic_file::a write that fails midway throws and leaves no temporary") {
  const Scratch s("atomic-midway");
  const std::string path = s.path("big.bin");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    const auto e = error_of([&] {
      AtomicFile file(path);
      file.write(std::string(100'000, 'b'));
      file.commit();
    });
    ::_exit(e == path + ": cannot write: File too large" ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(s.names().empty());
}

TEST_CASE("atomic_file::sync_folder refuses a missing folder") {
  const Scratch s("atomic-sync-folder");
  CHECK(error_of([&] { sync_folder(s.dir().string(), s.path("f")); }) == "no error");
  CHECK(error_of([&] { sync_folder(s.path("gone"), s.path("gone/f"), "--save"); }) ==
        "--save: cannot write \"" + s.path("gone/f") +
            "\": cannot sync the folder: No such file or directory");
}
