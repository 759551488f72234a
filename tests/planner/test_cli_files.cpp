// The planner's files: documents read whole from regular files within a bound, their errors
// naming the file; outputs written whole or through; names that are not UTF-8 in JSON output.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

namespace fs = std::filesystem;

using shardplan::planner::testing::planner;
using shardplan::planner::testing::Run;

struct Folder {
  explicit Folder(const std::string& name)
      : dir(fs::temp_directory_path() / ("shardplan-cli-files-" + name)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Folder() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
  fs::path dir;
};

const std::string kGpt2 = std::string(SHARDPLAN_SOURCE_DIR) + "/examples/models/gpt2/config.json";

}  // namespace

TEST_CASE("cli_files::a model file whose name is not UTF-8 gives JSON, not an internal error") {
  const Folder f("utf8");
  const std::string model = f / "m\xff\xfe.json";
  fs::copy_file(kGpt2, model);
  const std::string shown = (f / "m\xef\xbf\xbd\xef\xbf\xbd.json");  // each byte as U+FFFD
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"describe", "--model", model, "--format", "json"},
           {"recommend", "--model", model, "--emit", "plan"},
           {"recommend", "--model", model, "--format", "json"},
           {"estimate", "--model", model, "--strategy", "zero3", "--format", "json"}}) {
    CAPTURE(args[0]);
    const auto r = planner(args);
    REQUIRE(r.code == 0);
    // A config or plan goes to stdout whole; what was defaulted, to stderr.
    CHECK(r.err == (args[3] == "--emit"
                        ? "planner: not given, so defaulted: --hardware a100-sxm4-80gb, --gpus 8, "
                          "--seq-len 4096, --global-batch 32 (4 per GPU)\n"
                        : std::string()));
    CHECK(r.out.find(shown) != std::string::npos);
    CHECK(nlohmann::json::parse(r.out).is_object());
  }
}

TEST_CASE("cli_files::an error in a document names the file and the key") {
  const Folder f("named");
  const std::string job = f / "job.json", plan = f / "plan.json", run = f / "run.json";
  std::ofstream(job) << R"({"global_batch": 8})";
  auto r = planner({"estimate", "--strategy", "ddp", "--job", job});
  CHECK(r.code == 2);
  CHECK(r.err == "planner: " + job + ": /schema_version: missing key\n");
  std::ofstream(plan) << "{}";
  std::ofstream(run) << "{}";
  r = planner({"validate", "--plan", plan, "--run", run});
  CHECK(r.code == 2);
  CHECK(r.err.rfind("planner: " + plan + ": /", 0) == 0);
  const auto good_plan = planner({"recommend", "--emit", "plan"});
  REQUIRE(good_plan.code == 0);
  std::ofstream(plan) << good_plan.out;
  r = planner({"validate", "--plan", plan, "--run", run});
  CHECK(r.code == 2);
  CHECK(r.err == "planner: " + run + ": /schema_version: missing key\n");
  // validate --hardware: empty, or neither a profile nor a file, before the run is read.
  r = planner({"validate", "--plan", plan, "--run", run, "--hardware", ""});
  CHECK(r.code == 2);
  CHECK(r.err == "planner: --hardware: must be a profile or a file, got \"\"\n");
  r = planner({"validate", "--plan", plan, "--run", run, "--hardware", "no-such-profile"});
  CHECK(r.code == 2);
  CHECK(r.err.rfind("planner: --hardware: \"no-such-profile\" is neither a profile", 0) == 0);
  r = planner({"estimate", "--model", (f / "job.json"), "--strategy", "ddp"});
  CHECK(r.code == 2);
  CHECK(r.err.rfind("planner: " + job + ": /", 0) == 0);
}

TEST_CASE(
    "cli_files::a directory, a device, a FIFO or a huge file as a document is refused at once") {
  const Folder f("kinds");
  const std::string fifo = f / "pipe", big = f / "big.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(big) << "";
  fs::resize_file(big, std::uintmax_t{200} << 20);  // sparse: nothing is written
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  const Case cases[] = {
      {{"estimate", "--strategy", "ddp", "--job", f.dir.string()},
       f.dir.string() + ": is a directory, not a regular file"},
      {{"estimate", "--strategy", "ddp", "--model", "/dev/zero"},
       "/dev/zero: is a character device, not a regular file"},
      {{"estimate", "--model", "gpt2", "--deepspeed", fifo},
       fifo + ": is a FIFO, not a regular file"},
      {{"recommend", "--model", big},
       big + ": is 209715200 bytes, more than the 16 MiB (16777216 bytes) this file may have"},
      {{"validate", "--plan", "/dev/zero", "--run", big},
       "/dev/zero: is a character device, not a regular file"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args.back());
    const auto r = planner(c.args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err == "planner: " + c.err + "\n");
  }
}

TEST_CASE("cli_files::--svg and --trace are checked before the work and written whole") {
  const Folder f("outputs");
  auto r = planner({"recommend", "--svg", f / "no/such/m.svg"});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "planner: --svg: cannot write \"" + (f / "no/such/m.svg") +
                     "\": No such file or directory\n");
  r = planner({"simulate", "--strategy", "zero3", "--trace", f.dir.string()});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "planner: --trace: cannot write \"" + f.dir.string() + "\": it is a directory\n");
  CHECK(planner({"recommend", "--svg", f / "m.svg"}).code == 0);
  CHECK(planner({"simulate", "--strategy", "zero3", "--trace", f / "t.json"}).code == 0);
  CHECK(nlohmann::json::parse(std::ifstream(f / "t.json")).is_object());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(f.dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"m.svg", "t.json"});
  // A device is written through, and stays one.
  CHECK(planner({"recommend", "--svg", "/dev/null"}).code == 0);
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}
