// A checkpoint's index as a file and the paths it names: an index that is not a regular file is
// refused before it is read; a part's path holding a NUL is refused and shown escaped, not cut.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/input_error.hpp"
#include "executor/checkpoint.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan;
namespace fs = std::filesystem;

namespace {

// An index saved by 4 ranks under ZeRO-3 (the fuzz target's seed).
nlohmann::json seed_index() {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) +
                   "/tests/fuzz/seeds/checkpoint-zero3-4-ranks.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("checkpoint_index_files::a part path holding a NUL is refused and shown escaped") {
  auto index = seed_index();
  REQUIRE_NOTHROW(executor::checkpoint_index_from_json(index));
  index["files"][0]["path"] = std::string("step-00000002/\0..", 17);
  CHECK(error_of([&] { executor::checkpoint_index_from_json(index); }) ==
        "/files/0/path: must be a relative path inside the checkpoint, got "
        "\"step-00000002/\\x00..\"");
}

TEST_CASE("checkpoint_index_files::an index that is a link to /dev/zero or a folder is refused") {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("shardplan-index-files-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string index = (dir / "index.json").string();
  fs::create_symlink("/dev/zero", index);
  // Never followed: a checkpoint writes no links (checkpoint.cpp, read_own_file).
  CHECK(error_of([&] { executor::read_checkpoint_index(dir.string()); }) ==
        index + ": a symbolic link, which a checkpoint never writes");
  fs::remove(index);
  fs::create_directory(index);
  CHECK(error_of([&] { executor::read_checkpoint_index(dir.string()); }) ==
        index + ": is a directory, not a regular file");
  fs::remove_all(dir);
}
