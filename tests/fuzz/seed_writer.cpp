// Writes the seed documents that are not shipped as files: training jobs, sharding specs of every
// strategy and flavour, and plans of shipped models on a shipped hardware profile, each written by
// the project's own writers (job_to_json, spec_to_json, plan_to_json); and a run document with the
// layout executor/run_document.cpp writes (one rank, its summary). scripts/fuzz.sh runs it into the
// fuzz build's seed folders; nothing it writes is kept in the repository.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "costmodel/simulator.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/plan.hpp"
#include "documents/sharding.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::core;
using namespace shardplan::documents;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& dir, const std::string& name, const nlohmann::json& doc) {
  fs::create_directories(dir);
  std::ofstream(dir / (name + ".json")) << doc.dump(2) << "\n";
}

// The base job (returned), and one variant per precision cycling the other job keys.
TrainingJob write_jobs(const fs::path& out) {
  TrainingJob job;
  job.seq_len = 1024;
  job.global_batch = 16;
  job.micro_batch = 2;
  write(out / "job", "bf16-mixed", job_to_json(job));
  for (std::size_t i = 0; i < precision_names().size(); ++i) {
    TrainingJob j = job;
    j.precision = static_cast<Precision>(i);
    j.optimizer = static_cast<Optimizer>(i % optimizer_names().size());
    set_checkpointing(j, std::vector<std::string>{"none", "every:2", "selective-op", "full"}[i % 4],
                      "seed");
    set_loss(j, std::vector<std::string>{"upcast", "chunked:8", "fused", "fused-linear"}[i % 4],
             "seed");
    j.recipe = static_cast<Recipe>(i % recipe_names().size());
    j.attention = i % 2 ? AttentionImpl::eager : AttentionImpl::flash;
    j.micro_batch = static_cast<std::int64_t>(i);  // 0: no micro_batch key
    write(out / "job", fmt::format("variant-{}", i), job_to_json(j));
  }
  return job;
}

void write_specs(const fs::path& out) {
  for (const auto& strategy : strategy_names())
    for (Flavour f : flavours_for(strategy)) {
      const auto spec = make_spec(strategy, f, 8);
      write(out / "sharding", fmt::format("{}-{}", strategy, flavour_name(f)), spec_to_json(spec));
    }
}

void write_plans(const fs::path& out, const TrainingJob& job, const HardwareProfile& hw,
                 std::span<const ModelSpec> models) {
  for (const auto& m : models)
    for (const char* strategy : {"ddp", "zero3", "fsdp-full", "hsdp"}) {
      Plan p;
      p.model = m;
      p.hardware = hw.name;
      p.cluster = {16, 8};
      p.job = job;
      p.job.global_batch = 32;
      p.spec = make_spec(strategy, std::nullopt, p.cluster.gpus_per_node);
      StepInput in;
      in.model = &p.model;
      in.hardware = &hw;
      in.cluster = p.cluster;
      in.job = p.job;
      in.spec = p.spec;
      p.prediction = prediction_from(simulate_step(in));
      const std::string name =
          fmt::format("{}-{}", m.hf_config.is_null() ? "params" : m.name, strategy);
      write(out / "plan", name, plan_to_json(p));
    }
}

// A run of the gpt2 zero3 plan on 2 ranks, as executor/run_document.cpp lays it out.
void write_run(const fs::path& out, const TrainingJob& job, const HardwareProfile& hw,
               const ModelSpec& gpt2) {
  Plan p;
  p.model = gpt2;
  p.hardware = hw.name;
  p.cluster = {2, 8};
  p.job = job;
  p.job.global_batch = 4;
  p.spec = make_spec("zero3", std::nullopt, 8);
  const auto plan = plan_to_json(p);
  nlohmann::json at_peak = nlohmann::json::object();
  for (int c = 0; c < kCategories; ++c)
    at_peak[category_name(static_cast<Category>(c))] = 1e8 * (c + 1);
  const nlohmann::json by_kind = {
      {"all_gather", 0.01}, {"reduce_scatter", 0.02}, {"all_reduce", 0.0}};
  nlohmann::json run = {
      {"schema_version", 1},
      {"kind", "shardplan.run"},
      {"plan",
       {{"strategy", "zero3"},
        {"flavour", "deepspeed"},
        {"hardware", hw.name},
        {"model", "gpt2"},
        {"gpus", 2},
        {"job", plan["job"]},
        {"sharding", plan["sharding"]}}},
      {"prediction", plan["prediction"]},
      {"environment",
       {{"backend", "mpi"},
        {"library", "Open MPI"},
        {"ranks", 2},
        {"hosts", {"node0", "node0"}},
        {"rehearsal", false},
        {"build", {{"compiler", "c++"}, {"assertions", false}}}}},
      {"model",
       {{"name", "gpt2"},
        {"params", p.model.total_params()},
        {"scaled", false},
        {"units", 14},
        {"config", p.model.hf_config}}},
      {"execution",
       {{"precision", "fp32"},
        {"world_size", 2},
        {"steps", 3},
        {"micro_batch", 2},
        {"deviations", {"gradients are reduced in fp32"}}}},
      {"loss", {10.9, 10.8, 10.7}},
      {"initial_params_sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"final_params_sha256", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"ranks", nlohmann::json::array()},
      {"summary",
       {{"memory", {{"peak_bytes", 2.1e9}, {"rank", 0}, {"at_peak", at_peak}}},
        {"time",
         {{"rank", 1},
          {"step_s", 0.6},
          {"compute_s", 0.4},
          {"optimizer_s", 0.05},
          {"copy_s", 0.01},
          {"collectives_s", 0.03},
          {"collectives_by_kind_s", by_kind},
          {"collective_time_excluded", false}}},
        {"comm_bytes_per_step", 9.5e8}}}};
  write(out / "run", "gpt2-zero3-2-ranks", run);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (writes OUT_DIR/{job,sharding,plan,run}/*.json)\n",
                 argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  try {
    const TrainingJob job = write_jobs(out);
    write_specs(out);
    const auto hw = load_hardware("a100-sxm4-80gb");
    const ModelSpec models[] = {load_model("gpt2"), load_model("llama-2-7b"),
                                model_from_param_count(1.3e9, 24)};
    write_plans(out, job, hw, models);
    write_run(out, job, hw, models[0]);
  } catch (const InputError& e) {
    std::fprintf(stderr, "seed_writer: %s\n", e.what());
    return 2;
  }
  return 0;
}
