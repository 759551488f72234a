#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/file_reader.hpp"
#include "core/input_error.hpp"
#include "scratch.hpp"

using shardplan::core::InputError;
using shardplan::core::read_file;
using shardplan::core::test::Scratch;
using shardplan::core::test::write_text;

namespace {

std::string error_of(const std::string& path,
                     std::int64_t limit = shardplan::core::kDocumentBytes) {
  try {
    read_file(path, limit);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("file_reader::a regular file is read whole") {
  const Scratch s("whole");
  const std::string text(100'000, 'x');
  write_text(s.path("a.json"), text);
  CHECK(read_file(s.path("a.json")) == text);
  write_text(s.path("empty.json"), "");
  CHECK(read_file(s.path("empty.json")).empty());
}

TEST_CASE("file_reader::a missing file names errno's text") {
  CHECK(error_of("/no/such/file.json") ==
        "/no/such/file.json: cannot open file: No such file or directory");
}

TEST_CASE("file_reader::a directory is refused as a directory") {
  const Scratch s("directory");
  CHECK(error_of(s.dir().string()) == s.dir().string() + ": is a directory, not a regular file");
}

TEST_CASE("file_reader::/dev/zero is refused before anything is read") {
  CHECK(error_of("/dev/zero") == "/dev/zero: is a character device, not a regular file");
}

TEST_CASE("file_reader::a FIFO is refused at once, without waiting for a writer") {
  const Scratch s("fifo");
  const std::string fifo = s.path("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(error_of(fifo) == fifo + ": is a FIFO, not a regular file");
}

TEST_CASE("file_reader::a file above the bound is refused, the bound named") {
  const Scratch s("bound");
  write_text(s.path("small.json"), std::string(2048, ' '));
  CHECK(error_of(s.path("small.json"), 1024) ==
        s.path("small.json") + ": is 2048 bytes, more than the 1024 bytes this file may have");
  CHECK(read_file(s.path("small.json"), 2048).size() == 2048);
  // 17 MiB without writing them: a sparse file.
  write_text(s.path("big.json"), "");
  std::filesystem::resize_file(s.path("big.json"), std::uintmax_t{17} << 20);
  CHECK(error_of(s.path("big.json")) ==
        s.path("big.json") +
            ": is 17825792 bytes, more than the 16 MiB (16777216 bytes) this file may have");
}

TEST_CASE("file_reader::a symbolic link is followed, and its target's type decides") {
  const Scratch s("symlink");
  write_text(s.path("target.json"), "{}");
  std::filesystem::create_symlink(s.path("target.json"), s.path("link.json"));
  CHECK(read_file(s.path("link.json")) == "{}");
  std::filesystem::create_symlink("/dev/zero", s.path("zero.json"));
  CHECK(error_of(s.path("zero.json")) ==
        s.path("zero.json") + ": is a character device, not a regular file");
  std::filesystem::create_symlink(s.path("nothing"), s.path("dangling.json"));
  CHECK(error_of(s.path("dangling.json")) ==
        s.path("dangling.json") + ": cannot open file: No such file or directory");
}

TEST_CASE("file_reader::a path with a NUL byte is refused and shown escaped") {
  CHECK(error_of(std::string("g/\0..", 5)) == "g/\\x00..: a path cannot hold a NUL byte");
}
