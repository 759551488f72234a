// Checkpoints in one process (a world of one rank): a save and a resume under another strategy
// keep every bit, consolidate writes the bytes the parameter hash covers, and a truncated,
// corrupted, incomplete or mismatched checkpoint is an error naming the file. The resharding
// across world sizes runs under mpirun (test_checkpoint_mpi.cpp, checkpoint_test.cmake).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>

#include "costmodel/input_error.hpp"
#include "engine_fixture.hpp"
#include "executor/checkpoint.hpp"
#include "executor/sha256.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::executor::testing;
using costmodel::Flavour;
using costmodel::InputError;
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
  Solo(const costmodel::ModelSpec& model, const char* strategy, Flavour flavour)
      : engine(test_options(model, test_spec(strategy, flavour, 1)), allocator,
               {&world, &world, nullptr, false}) {}
};

std::string file_sha256(const fs::path& path) {
  std::string bytes(fs::file_size(path), '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return Sha256::hex(Sha256::of(bytes));
}

// The message of the InputError f throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream(p) << j.dump(1);
}

} // namespace

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
  auto load_error = [&](const costmodel::ModelSpec& m) {
    Solo s(m, "zero3", Flavour::deepspeed);
    return error_of([&] { load_checkpoint(s.engine, s.world, bad.string()); });
  };
  auto edit_index = [&](const std::function<void(nlohmann::json&)>& f) {
    auto j = read_json(index);
    f(j);
    write_json(index, j);
  };

  fresh_copy();
  CHECK(load_error(model).empty());

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
    CHECK(load_error(model).find(index.string() + ": not valid JSON") != std::string::npos);
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
    const auto deeper = scale_down(costmodel::load_model("gpt2"), {.layers = 3,
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
    CHECK(load_error(model) == index.string() + ": cannot open file: No such file or directory");
  }
}
