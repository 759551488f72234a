// Checkpoints in one process (a world of one rank): a save and a resume under another strategy
// keep every bit, consolidate writes the bytes the parameter hash covers, and a truncated,
// corrupted, edited, incomplete or mismatched checkpoint is an error naming the file. A save
// removes only the older step folders it wrote, never through a symbolic link; a run refuses a
// folder that holds another run's checkpoint, and a second writer of the folder. The resharding
// across world sizes runs under mpirun (test_checkpoint_mpi.cpp, checkpoint_test.cmake).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>

#include "comm/process_identity.hpp"
#include "core/input_error.hpp"
#include "engine_fixture.hpp"
#include "executor/checkpoint.hpp"
#include "executor/sha256.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using core::InputError;
using documents::Flavour;
namespace fs = std::filesystem;

namespace {

// A scratch folder of the test's own, removed afterwards.
struct Scratch {
  fs::path path;
  explicit Scratch(const char* name)
      : path(fs::temp_directory_path() / fmt::format("shardplan-{}-{}", name, ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// An engine on a world of one.
struct Solo {
  StandInCommunicator world{0, 1};
  TrackedAllocator allocator;
  ShardingEngine engine;
  Solo(const documents::ModelSpec& model, const char* strategy, Flavour flavour)
      : engine(test_options(model, test_spec(strategy, flavour, 1)), allocator,
               {&world, &world, nullptr, false}) {}
};

std::string file_sha256(const fs::path& path) {
  std::string bytes(fs::file_size(path), '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return Sha256::hex(Sha256::of(bytes));
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(1); }
// Rewrites DIR/index.json.sha256 for the index as it now is, as whoever edits an index can.
void sign_index(const fs::path& dir) {
  std::ofstream(dir / "index.json.sha256") << file_sha256(dir / "index.json") << "  index.json\n";
}
void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

}  // namespace

TEST_CASE("checkpoint::a resume under another strategy continues bit for bit") {
  const Scratch dir("checkpoint-resume");
  const auto model = tiny_llama();
  Solo saved(model, "zero3", Flavour::deepspeed);
  saved.engine.step();
  saved.engine.step();
  save_checkpoint(saved.engine, saved.world, dir.path.string());
  const auto saved_hash = params_sha256(saved.engine);
  CHECK(fs::exists(dir.path / "index.json"));
  CHECK(fs::exists(dir.path / "step-00000002" / "part-00000-of-00001.bin"));

  // Another strategy starts from exactly the saved parameters.
  Solo other(model, "ddp", Flavour::ddp);
  const auto report = load_checkpoint(other.engine, other.world, dir.path.string());
  CHECK(report.step == 2);
  CHECK(other.engine.steps_done() == 2);
  CHECK(params_sha256(other.engine) == saved_hash);
  // One rank holds everything: it reads the parameters and both moments once.
  CHECK(report.bytes_read == 3 * static_cast<std::int64_t>(sizeof(float)) * model.total_params());

  // Two more steps of the same plan from the checkpoint end where two more steps of the saved
  // run end, bit for bit. (Another strategy sums the micro-batches' gradients in another order:
  // equal within rounding only, engine::sharded strategies train as DDP.)
  Solo resumed(model, "zero3", Flavour::deepspeed);
  load_checkpoint(resumed.engine, resumed.world, dir.path.string());
  for (int k = 0; k < 2; ++k) {
    const auto a = saved.engine.step(), b = resumed.engine.step();
    CHECK(a.step == b.step);
    CHECK(a.loss == b.loss);
  }
  CHECK(params_sha256(resumed.engine) == params_sha256(saved.engine));

  // consolidate writes exactly the bytes the hash covers. A later save replaces the earlier
  // step's folder once its index is in place.
  save_checkpoint(resumed.engine, resumed.world, dir.path.string());
  CHECK_FALSE(fs::exists(dir.path / "step-00000002"));
  const auto out = dir.path / "model.bin";
  const auto c = consolidate_checkpoint(dir.path.string(), out.string());
  CHECK(c.step == 4);
  CHECK(c.params == model.total_params());
  CHECK(fs::file_size(out) == static_cast<std::uintmax_t>(4 * model.total_params()));
  CHECK(c.sha256 == params_sha256(resumed.engine));
  CHECK(file_sha256(out) == c.sha256);
}

// Left whole: long as one case, short as run; each SUBCASE runs alone after the shared setup.
TEST_CASE("checkpoint::a damaged or mismatched checkpoint is an error naming the file") {
  const Scratch dir("checkpoint-damaged");
  const auto model = tiny_gpt2();
  const auto good = dir.path / "good";
  {
    Solo s(model, "zero2", Flavour::deepspeed);
    s.engine.step();
    save_checkpoint(s.engine, s.world, good.string());
  }
  const auto bad = dir.path / "bad";
  const auto index = bad / "index.json";
  const auto part = bad / "step-00000001" / "part-00000-of-00001.bin";
  auto fresh_copy = [&] {
    fs::remove_all(bad);
    fs::copy(good, bad, fs::copy_options::recursive);
  };
  auto load_error = [&](const documents::ModelSpec& m) {
    Solo s(m, "zero3", Flavour::deepspeed);
    return error_of([&] { load_checkpoint(s.engine, s.world, bad.string()); });
  };
  // An edit that recomputes the index's digest, to reach the checks behind it.
  auto edit_index = [&](const std::function<void(nlohmann::json&)>& f) {
    auto j = read_json(index);
    f(j);
    write_json(index, j);
    sign_index(bad);
  };

  fresh_copy();
  CHECK(load_error(model) == "no error");

  SUBCASE("a truncated part") {
    fs::resize_file(part, fs::file_size(part) - 4);
    const auto e = load_error(model);
    CHECK(e.find(part.string() + ": truncated") != std::string::npos);
    CHECK(error_of([&] { consolidate_checkpoint(bad.string(), (dir.path / "m.bin").string()); }) ==
          e);
  }
  SUBCASE("a corrupted part") {
    {
      std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(17);
      f.put('\x5a');
    }
    CHECK(load_error(model).find(part.string() + ": corrupted: its sha256 is") !=
          std::string::npos);
  }
  SUBCASE("a missing part") {
    fs::remove(part);
    CHECK(load_error(model).find(part.string() + ": cannot read") != std::string::npos);
  }
  SUBCASE("a truncated index") {
    fs::resize_file(index, fs::file_size(index) / 2);
    CHECK(load_error(model).find(index.string() + ": its sha256 is ") != std::string::npos);
    sign_index(bad);
    CHECK(load_error(model).find(index.string() + ": not valid JSON") != std::string::npos);
  }
  SUBCASE("an index edited without its digest") {
    auto j = read_json(index);
    j["files"][0]["segments"][0]["end"] = 1;  // anything: the digest is checked first
    write_json(index, j);
    CHECK(load_error(model).find(index.string() + ": its sha256 is ") != std::string::npos);
    CHECK(load_error(model).find(", index.json.sha256 says ") != std::string::npos);
  }
  SUBCASE("a save cut short between renaming the index and its digest") {
    // The previous save's digest beside the new index: the index is its step folder's copy.
    write_text(bad / "index.json.sha256", std::string(64, '0') + "  index.json\n");
    CHECK(load_error(model) == "no error");
    // Not when the copy differs, or is not there.
    auto copy = read_json(bad / "step-00000001" / "index.json");
    copy["saved_by"]["seed"] = 7;
    write_json(bad / "step-00000001" / "index.json", copy);
    sign_index(bad / "step-00000001");
    CHECK(load_error(model).find(index.string() + ": its sha256 is ") != std::string::npos);
    fs::remove(bad / "step-00000001" / "index.json");
    CHECK(load_error(model).find(index.string() + ": its sha256 is ") != std::string::npos);
  }
  SUBCASE("an index without its digest") {
    fs::remove(bad / "index.json.sha256");
    CHECK(load_error(model) == (bad / "index.json.sha256").string() +
                                   ": missing: the digest of index.json, written beside it");
  }
  SUBCASE("a digest that is not one line of sha256sum") {
    write_text(bad / "index.json.sha256", std::string(64, 'a'));
    CHECK(load_error(model).find((bad / "index.json.sha256").string() + ": must be one line") !=
          std::string::npos);
  }
  SUBCASE("an index of version 1") {
    edit_index([](auto& j) { j["schema_version"] = 1; });
    CHECK(load_error(model) ==
          index.string() + ": /schema_version: 1, a checkpoint without the digests of its index "
                           "and ranges, which this executor no longer reads (it needs 2)");
    fs::remove(bad / "index.json.sha256");
    CHECK(load_error(model).find("/schema_version: 1, a checkpoint without") != std::string::npos);
  }
  SUBCASE("the labels exp_avg and exp_avg_sq swapped, the index's digest recomputed") {
    edit_index([](auto& j) {
      for (auto& seg : j["files"][0]["segments"])
        if (seg["tensor"] == "exp_avg")
          seg["tensor"] = "exp_avg_sq";
        else if (seg["tensor"] == "exp_avg_sq")
          seg["tensor"] = "exp_avg";
    });
    // The ranges still tile every tensor and the part is the one saved: only the segments'
    // digests, which cover their labels, tell.
    const auto e = load_error(model);
    CHECK(e.find(part.string() + ": bytes [") != std::string::npos);
    CHECK(e.find(" are not exp_avg_sq of unit 0, elements [0, ") != std::string::npos);
    CHECK(e.find("as the index says: their sha256 with that label is ") != std::string::npos);
    CHECK(error_of([&] { consolidate_checkpoint(bad.string(), (dir.path / "m.bin").string()); }) ==
          e);
  }
  SUBCASE("a segment's digest that is not its range's") {
    edit_index([](auto& j) { j["files"][0]["segments"][2]["sha256"] = std::string(64, 'e'); });
    CHECK(load_error(model).find(" are not params of unit 2, elements [0, ") != std::string::npos);
  }
  SUBCASE("a segment without a digest") {
    edit_index([](auto& j) { j["files"][0]["segments"][1].erase("sha256"); });
    CHECK(load_error(model) == index.string() + ": /files/0/segments/1/sha256: missing key");
  }
  SUBCASE("a step past the last a checkpoint may hold") {
    for (const std::int64_t step : {std::int64_t{9223372036854775807}, std::int64_t{1000000001}}) {
      CAPTURE(step);
      edit_index([step](auto& j) {
        j["step"] = step;
        j["adamw_step"] = step;
      });
      CHECK(load_error(model) == index.string() + fmt::format(": /step: must be <= 1000000000, "
                                                              "got {}",
                                                              step));
    }
  }
  SUBCASE("an index or a digest that is a symbolic link, a folder or a FIFO") {
    fs::rename(index, bad / "real-index.json");
    fs::create_symlink("real-index.json", index);
    CHECK(load_error(model) ==
          index.string() + ": a symbolic link, which a checkpoint never writes");
    fs::remove(index);
    fs::create_directory(index);
    CHECK(load_error(model) == index.string() + ": is a directory, not a regular file");
    fs::remove(index);
    fs::rename(bad / "real-index.json", index);
    const auto digest = bad / "index.json.sha256";
    fs::remove(digest);
    REQUIRE(::mkfifo(digest.c_str(), 0644) == 0);
    CHECK(load_error(model) == digest.string() + ": is a FIFO, not a regular file");
  }
  SUBCASE("a missing key") {
    edit_index([](auto& j) { j["files"][0].erase("sha256"); });
    CHECK(load_error(model) == index.string() + ": /files/0/sha256: missing key");
  }
  SUBCASE("an unknown key") {
    edit_index([](auto& j) { j["extra"] = 1; });
    CHECK(load_error(model) == index.string() + ": /extra: unknown key");
  }
  SUBCASE("a checksum in the index that is not the file's") {
    edit_index([](auto& j) { j["files"][0]["sha256"] = std::string(64, '0'); });
    CHECK(load_error(model).find(part.string() + ": corrupted") != std::string::npos);
  }
  SUBCASE("segments that leave a range out") {
    edit_index([](auto& j) {
      auto& segments = j["files"][0]["segments"];
      const auto last = segments.back();
      segments.erase(segments.size() - 1);
      j["files"][0]["bytes"] = j["files"][0]["bytes"].template get<std::int64_t>() -
                               4 * (last["end"].template get<std::int64_t>() -
                                    last["begin"].template get<std::int64_t>());
    });
    CHECK(load_error(model).find(index.string() + ": /files: exp_avg_sq of unit 3: elements") !=
          std::string::npos);
  }
  SUBCASE("a path outside the checkpoint") {
    edit_index([](auto& j) { j["files"][0]["path"] = "../elsewhere.bin"; });
    CHECK(load_error(model).find(index.string() + ": /files/0/path: must be a relative path") !=
          std::string::npos);
  }
  SUBCASE("another dtype") {
    edit_index([](auto& j) { j["dtypes"]["exp_avg"] = "bf16"; });
    CHECK(load_error(model).find(index.string() + ": /dtypes/exp_avg") != std::string::npos);
  }
  SUBCASE("an AdamW step that is not the training step") {
    edit_index([](auto& j) { j["adamw_step"] = 7; });
    CHECK(load_error(model) == index.string() + ": /adamw_step: must equal /step (1), got 7");
  }
  SUBCASE("a checkpoint of another model") {
    const auto e = load_error(tiny_llama());
    CHECK(e.find(index.string() + ": /model/") != std::string::npos);
    CHECK(e.find("a checkpoint of another model") != std::string::npos);
    const auto deeper = scale_down(documents::load_model("gpt2"), {.layers = 3,
                                                                   .hidden = 16,
                                                                   .heads = 4,
                                                                   .intermediate = 32,
                                                                   .vocab = 50,
                                                                   .max_positions = 12});
    CHECK(load_error(deeper) ==
          index.string() + ": /model/layers: the checkpoint's model has 2, the run's model 3 "
                           "(a checkpoint of another model)");
  }
  SUBCASE("no checkpoint at all") {
    fs::remove(index);
    CHECK(load_error(model) == index.string() + ": cannot read: No such file or directory");
  }
}

TEST_CASE("checkpoint::a save removes only the older step folders it wrote") {
  const Scratch dir("checkpoint-prune");
  const auto model = tiny_gpt2();
  const auto ck = dir.path / "ck";
  fs::create_directories(ck / "step-00000009");
  write_text(ck / "step-00000009" / "notes.txt", "a newer step's name, not a checkpoint");
  Solo s(model, "zero3", Flavour::deepspeed);
  s.engine.step();
  save_checkpoint(s.engine, s.world, ck.string());
  CHECK(fs::exists(ck / "step-00000001" / "index.json"));  // the step folder's own copy
  CHECK(fs::exists(ck / "step-00000001" / "index.json.sha256"));

  SUBCASE("a user's file in an older step's folder stays, with the folder") {
    write_text(ck / "step-00000001" / "notes.txt", "mine");
    s.engine.step();
    save_checkpoint(s.engine, s.world, ck.string());
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(ck / "step-00000001"))
      left.push_back(e.path().filename().string());
    CHECK(left == std::vector<std::string>{"notes.txt"});
  }
  SUBCASE("an older step's folder with our files only goes") {
    s.engine.step();
    save_checkpoint(s.engine, s.world, ck.string());
    CHECK_FALSE(fs::exists(ck / "step-00000001"));
  }
  SUBCASE("an older step's folder without a valid index stays whole") {
    write_text(ck / "step-00000001" / "index.json", "{}");
    s.engine.step();
    save_checkpoint(s.engine, s.world, ck.string());
    CHECK(fs::exists(ck / "step-00000001" / "part-00000-of-00001.bin"));
  }
  SUBCASE("an older step's name linked to a folder elsewhere: neither the link nor its files go") {
    const auto elsewhere = dir.path / "elsewhere";
    fs::rename(ck / "step-00000001", elsewhere);  // a complete step folder of this format
    fs::create_directory_symlink(elsewhere, ck / "step-00000001");
    s.engine.step();
    save_checkpoint(s.engine, s.world, ck.string());
    CHECK(fs::is_symlink(ck / "step-00000001"));
    CHECK(fs::exists(elsewhere / "part-00000-of-00001.bin"));
    CHECK(fs::exists(elsewhere / "index.json"));
  }
  // Step 9 is newer than the run's: its folder stays whatever it holds.
  CHECK(fs::exists(ck / "step-00000009" / "notes.txt"));
  CHECK(fs::exists(ck / "step-00000002" / "part-00000-of-00001.bin"));
}

TEST_CASE("checkpoint::a step folder that is a symbolic link is refused, nothing written there") {
  const Scratch dir("checkpoint-linked-step");
  const auto ck = dir.path / "ck", elsewhere = dir.path / "elsewhere";
  fs::create_directories(ck);
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, ck / "step-00000001");
  Solo s(tiny_gpt2(), "zero3", Flavour::deepspeed);
  s.engine.step();
  CHECK(error_of([&] { save_checkpoint(s.engine, s.world, ck.string()); }) ==
        (ck / "step-00000001").string() +
            ": a symbolic link: a checkpoint writes its parts only into folders of its own");
  CHECK(fs::is_empty(elsewhere));
  CHECK_FALSE(fs::exists(ck / "index.json"));
  // A run finds it before its first step.
  CheckpointOptions o;
  o.save_dir = ck.string();
  CHECK(error_of([&] {
          check_save_destination(o, s.engine, {1, 2});
        }) == (ck / "step-00000001").string() +
                  ": a symbolic link: a checkpoint writes its parts only into folders of its own");
}

TEST_CASE(
    "checkpoint::a folder holding another run's checkpoint is refused before the first step") {
  const Scratch dir("checkpoint-destination");
  const auto model = tiny_gpt2();
  const auto ck = dir.path / "ck";
  {
    Solo s(model, "zero3", Flavour::deepspeed);
    s.engine.step();
    s.engine.step();
    save_checkpoint(s.engine, s.world, ck.string());
  }
  CheckpointOptions o;
  o.save_dir = ck.string();
  auto refusal = [&](const ShardingEngine& e, std::vector<std::int64_t> steps) {
    return error_of([&] { check_save_destination(o, e, steps); });
  };
  const std::string held = fmt::format(
      "--save: \"{}\" holds the checkpoint of model \"{}\" at step 2, ", ck.string(), model.name);
  Solo same(model, "zero3", Flavour::deepspeed);

  SUBCASE("a later step than the run saves first") {
    CHECK(refusal(same.engine, {1}) ==
          held + "later than step 1, the first this run saves; --overwrite replaces it");
    CHECK(refusal(same.engine, {2, 3}) == "no error");  // the run saves step 2 again and goes on
  }
  SUBCASE("another model") {
    Solo other(tiny_llama(), "zero3", Flavour::deepspeed);
    const auto e = refusal(other.engine, {5});
    CHECK(e.find(held + "another model than this run's (/model/") == 0);
    CHECK(e.find("; --overwrite replaces it") != std::string::npos);
  }
  SUBCASE("another plan") {
    Solo other(model, "ddp", Flavour::ddp);
    CHECK(refusal(other.engine, {5}) ==
          held + "saved by another plan (/saved_by/strategy is \"zero3\", this run's \"ddp\"); "
                 "--overwrite replaces it");
  }
  SUBCASE("what does not read as a checkpoint") {
    write_text(ck / "index.json", "not json");
    const auto e = refusal(same.engine, {5});
    CHECK(e.find(fmt::format("--save: \"{}\" holds what this executor does not read as a "
                             "checkpoint ({}: its sha256 is ",
                             ck.string(), (ck / "index.json").string())) == 0);
  }
  SUBCASE("--overwrite, or a resume from it, may") {
    o.overwrite = true;
    CHECK(refusal(same.engine, {1}) == "no error");
    o.overwrite = false;
    o.resume_dir = ck.string();
    Solo other(tiny_llama(), "ddp", Flavour::ddp);
    CHECK(refusal(other.engine, {1}) == "no error");
  }
  SUBCASE("an empty or new folder may") {
    o.save_dir = (dir.path / "new").string();
    CHECK(refusal(same.engine, {1}) == "no error");
  }
  CHECK(saved_steps(0, 5, 2) == std::vector<std::int64_t>{2, 4, 5});
  CHECK(saved_steps(3, 2, 0) == std::vector<std::int64_t>{5});
}

TEST_CASE("checkpoint::a run goes no further than the last step a checkpoint may hold") {
  const Scratch dir("checkpoint-last-step");
  const auto model = tiny_gpt2();
  const auto ck = dir.path / "ck";
  {
    Solo s(model, "zero3", Flavour::deepspeed);
    s.engine.step();
    save_checkpoint(s.engine, s.world, ck.string());
  }
  auto j = read_json(ck / "index.json");
  j["step"] = kMaxCheckpointStep - 1;
  j["adamw_step"] = kMaxCheckpointStep - 1;
  write_json(ck / "index.json", j);
  sign_index(ck);
  CheckpointOptions o;
  o.resume_dir = ck.string();
  Solo s(model, "zero3", Flavour::deepspeed);
  RunCheckpoints one_step(o, s.world, 1);
  CHECK(error_of([&] { one_step.start(s.engine); }) == "no error");
  RunCheckpoints two_steps(o, s.world, 2);
  CHECK(error_of([&] { two_steps.start(s.engine); }) ==
        fmt::format("--resume: \"{}\" holds step 999999999: 2 more steps pass step 1000000000, "
                    "the last a checkpoint may hold",
                    ck.string()));
}

TEST_CASE("checkpoint::a folder is written by one executor at a time") {
  const Scratch dir("checkpoint-lock");
  const auto ck = dir.path / "a" / "ck";
  {
    const auto held = CheckpointLock::take(ck.string());  // makes the folders
    // flock belongs to the open file: a second take, in this process too, is refused.
    CHECK(error_of([&] { CheckpointLock::take(ck.string()); }) ==
          fmt::format("--save: \"{}\" is being written by pid {} on host {}", ck.string(),
                      ::getpid(), comm::host_name()));
  }
  CHECK(error_of([&] { CheckpointLock::take(ck.string()); }) == "no error");  // released with it
  // A lock file that is a link (to anything) is named as one, not as errno's ELOOP.
  const auto linked = dir.path / "linked";
  std::filesystem::create_directories(linked);
  std::filesystem::create_symlink(dir.path / "elsewhere", linked / ".lock");
  CHECK(error_of([&] { CheckpointLock::take(linked.string()); }) ==
        fmt::format("--save: \"{}\" is a symbolic link; the lock file is never followed through "
                    "one (remove it)",
                    (linked / ".lock").string()));
  // A folder that cannot be made: its parent is a file.
  write_text(dir.path / "file", "");
  CHECK(error_of([&] { CheckpointLock::take((dir.path / "file" / "ck").string()); }) ==
        fmt::format("--save: cannot make the folder \"{}\": Not a directory",
                    (dir.path / "file" / "ck").string()));
  // A folder that cannot be written in (permission bits do not stop root).
  if (::geteuid() != 0) {
    const auto ro = dir.path / "ro";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(error_of([&] { CheckpointLock::take((ro / "ck").string()); }) ==
          fmt::format("--save: cannot make the folder \"{}\": Permission denied",
                      (ro / "ck").string()));
    CHECK(error_of([&] { CheckpointLock::take(ro.string()); }) ==
          fmt::format("--save: cannot write in \"{}\": Permission denied", ro.string()));
    fs::permissions(ro, fs::perms::owner_all);
  }
}
