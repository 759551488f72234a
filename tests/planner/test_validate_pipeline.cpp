// planner validate of a pipeline run (planner/validate_pipeline.hpp): per stage, the cost model's
// prediction for the run's layout against each stage's measured peak; malformed pipeline run
// documents are refused naming the field.
#include <doctest/doctest.h>

#include <string>

#include "core/input_error.hpp"
#include "costmodel/parallel_step.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "documents/hardware.hpp"
#include "documents/plan.hpp"
#include "planner/validate.hpp"

using namespace shardplan;
using nlohmann::json;

namespace {

documents::Plan plan(const std::string& hardware) {
  documents::Plan p;
  p.model = documents::load_model("gpt2");  // 12 blocks: 6 per stage
  p.hardware = hardware;
  p.cluster = {2, 2};
  p.job.seq_len = 128;
  p.job.global_batch = 8;
  p.job.micro_batch = 1;
  p.job.precision = documents::Precision::fp32;
  p.job.attention = documents::AttentionImpl::eager;
  p.job.checkpointing = documents::Checkpointing::none;
  p.job.recipe = documents::Recipe::executor;
  p.spec = documents::make_spec("ddp", documents::Flavour::ddp, 2);
  p.prediction.peak_bytes = 1000;
  p.prediction.step_s = 1;
  p.prediction.peak_when = "backward of head";
  return p;
}

// As the executor writes it (executor/pipeline_run.cpp): 2 stages × 1 rank, 1F1B, 4 micro-batches
// of 2 sequences; stage 1 measured the higher peak.
json pipeline_run() {
  json steps = json::array();
  for (double s : {0.5, 0.3, 0.4})
    steps.push_back({{"step", steps.size() + 1},
                     {"loss", 4.0},
                     {"step_s", s},
                     {"forward_s", 0.1},
                     {"backward_s", 0.2},
                     {"p2p_s", 0.01},
                     {"reduce_s", 0.0},
                     {"optimizer_s", 0.05}});
  return {{"schema_version", 1},
          {"kind", "executor pipeline run"},
          {"model", "gpt2"},
          {"strategy", "ddp"},
          {"world", 2},
          {"pipeline",
           {{"pipeline_parallel", 2},
            {"data_parallel", 1},
            {"schedule", "1f1b"},
            {"micro_batches", 4},
            {"micro_batch", 2},
            {"seq_len", 128}}},
          {"steps", steps},
          {"stages_measured",
           {{{"peak_bytes", 2.0e9}, {"activations_bytes_at_peak", 1.0e9}},
            {{"peak_bytes", 2.5e9}, {"activations_bytes_at_peak", 1.5e9}}}},
          {"stages_counted", json::array()}};
}

// The cost model's stages for the run's layout, as validate makes them: the plan's job with the
// run's micro-batch, DDP without a bucket copy (the stages reduce in place), walked by
// simulate_parallel_step.
costmodel::ParallelMemory stages(const documents::Plan& p, const documents::HardwareProfile& hw) {
  costmodel::StepInput in;
  in.model = &p.model;
  in.hardware = &hw;
  in.cluster = {2, 2};
  in.job = p.job;
  in.job.micro_batch = 2;
  in.spec = p.spec;
  in.spec.grad_bucket_copy = false;
  documents::ParallelLayout l;
  l.pipeline_parallel = 2;
  l.micro_batches = 4;
  const auto r = costmodel::simulate_parallel_step(in, l);
  REQUIRE_MESSAGE(r.step.valid, r.step.reason);
  return r.memory;
}

}  // namespace

TEST_CASE("validate::a pipeline run is compared per stage") {
  const auto p = plan("h100-sxm5-80gb");
  const auto hw = documents::load_hardware("h100-sxm5-80gb");
  const auto want = stages(p, hw);
  const auto v = planner::validate_json(documents::plan_to_json(p), pipeline_run());
  CHECK(v["kind"] == "pipeline");
  REQUIRE(v["stages"].size() == 2);
  for (std::size_t s = 0; s < 2; ++s) {
    const double predicted = want.stages[s].total();
    const double measured = s == 0 ? 2.0e9 : 2.5e9;
    CHECK(v["stages"][s]["predicted_bytes"].get<double>() == doctest::Approx(predicted));
    CHECK(v["stages"][s]["measured_bytes"].get<double>() == measured);
    CHECK(v["stages"][s]["rel_error"].get<double>() ==
          doctest::Approx((predicted - measured) / measured));
  }
  // 1F1B keeps p = 2 micro-batches in flight on stage 0 and one on the last.
  CHECK(v["stages"][0]["in_flight"].get<double>() == 2);
  CHECK(v["stages"][1]["in_flight"].get<double>() == 1);
  CHECK(v["memory"]["peak_stage_measured"] == 1);
  CHECK(v["memory"]["peak_stage_predicted"] == want.peak_stage);
  CHECK(v["memory"]["peak_measured_bytes"].get<double>() == 2.5e9);
  // The median of the three steps 0.5, 0.3, 0.4; a predicted step time from the loaded profile.
  CHECK(v["time"]["step_measured_s"].get<double>() == doctest::Approx(0.4));
  CHECK(v["time"]["step_predicted_s"].get<double>() > 0);
  const auto table = planner::validate_table(documents::plan_to_json(p), pipeline_run());
  CHECK(table.find("run: 2 pipeline stages × 1 data-parallel ranks, 1f1b, 4 micro-batches of 2 × "
                   "128 tokens") != std::string::npos);
  CHECK(table.find("step (median of 3)") != std::string::npos);
  CHECK(table.find("measured)") != std::string::npos);
}

TEST_CASE("validate::a pipeline run of another plan is refused naming the field") {
  // The stages ran DDP over 128 tokens; a ZeRO-1 plan (DeepSpeed's, which its pipeline engine
  // runs), or one of 4,096 tokens, is another job.
  auto zero1 = plan("h100-sxm5-80gb");
  zero1.spec = documents::make_spec("zero1", std::nullopt, 2);
  CHECK_THROWS_WITH_AS(
      planner::validate_json(documents::plan_to_json(zero1), pipeline_run()),
      "/strategy: not a run of this plan: the run's ddp, the plan's zero1 (--force compares them "
      "anyway)",
      core::InputError);
  auto longer = plan("h100-sxm5-80gb");
  longer.job.seq_len = 4096;
  CHECK_THROWS_WITH_AS(
      planner::validate_json(documents::plan_to_json(longer), pipeline_run()),
      "/pipeline/seq_len: not a run of this plan: the run's sequence length 128, the plan's "
      "sequence length 4096 (--force compares them anyway)",
      core::InputError);
  const auto forced = planner::validate_json(documents::plan_to_json(zero1), pipeline_run(), true);
  CHECK(forced.contains("stages"));
}

TEST_CASE("validate::a pipeline run without a loadable profile: memory only, said in a note") {
  const auto v =
      planner::validate_json(documents::plan_to_json(plan("no-such-profile")), pipeline_run());
  CHECK(v["time"]["step_predicted_s"].is_null());
  CHECK(v["time"]["step_rel_error"].is_null());
  REQUIRE(!v["notes"].empty());
  CHECK(v["notes"][0].get<std::string>().find("\"no-such-profile\" could not be loaded") !=
        std::string::npos);
  // planner validate --hardware: the profile given predicts the stages and the step, as the
  // plan's own would have (the same numbers as a plan naming that preset).
  const auto hw = documents::load_hardware("h100-sxm5-80gb");
  const auto given = planner::validate_json(documents::plan_to_json(plan("no-such-profile")),
                                            pipeline_run(), false, &hw);
  const auto named =
      planner::validate_json(documents::plan_to_json(plan("h100-sxm5-80gb")), pipeline_run());
  REQUIRE(given["time"]["step_predicted_s"].is_number());
  CHECK(given["time"]["step_predicted_s"] == named["time"]["step_predicted_s"]);
  CHECK(given["stages"] == named["stages"]);
}

TEST_CASE("validate::a malformed pipeline run is refused naming the field") {
  const auto p = documents::plan_to_json(plan("h100-sxm5-80gb"));
  struct Case {
    const char* what;
    json run;
    const char* message;
  };
  auto with = [](auto change) {
    json r = pipeline_run();
    change(r);
    return r;
  };
  const Case cases[] = {
      {"one stage measured of two", with([](json& r) { r["stages_measured"].erase(1); }),
       "/stages_measured: 1 stages, /pipeline/pipeline_parallel says 2"},
      {"ranks not stages × data-parallel",
       with([](json& r) { r["pipeline"]["data_parallel"] = 2; }),
       "/pipeline/data_parallel: 2 stages × 2 data-parallel ranks × 1 tensor-parallel ranks are "
       "not the run's 2 ranks "
       "(/world)"},
      {"a stage without its peak",
       with([](json& r) { r["stages_measured"][1].erase("peak_bytes"); }),
       "/stages_measured/1/peak_bytes: missing key"},
      {"no steps", with([](json& r) { r["steps"] = json::array(); }),
       "/steps: the run has no steps"},
      {"a negative step time", with([](json& r) { r["steps"][0]["step_s"] = -1; }),
       "/steps/0/step_s: must be >= 0, got -1"},
      {"chunks without the interleaved schedule",
       with([](json& r) { r["pipeline"]["virtual_stages"] = 2; }),
       "/pipeline/virtual_stages: 2 needs the interleaved-1f1b schedule, got 1f1b"},
      {"the interleaved schedule with one chunk",
       with([](json& r) { r["pipeline"]["schedule"] = "interleaved-1f1b"; }),
       "/pipeline/virtual_stages: the interleaved-1f1b schedule needs >= 2, got 1"},
      {"interleaved micro-batches not a multiple of the stages", with([](json& r) {
         r["pipeline"]["schedule"] = "interleaved-1f1b";
         r["pipeline"]["virtual_stages"] = 2;
         r["pipeline"]["micro_batches"] = 3;
       }),
       "/pipeline/micro_batches: the interleaved-1f1b schedule needs a multiple of the 2 stages, "
       "got 3"},
      {"zero micro-batches", with([](json& r) { r["pipeline"]["micro_batches"] = 0; }),
       "/pipeline/micro_batches: must be >= 1, got 0"},
      {"a later version", with([](json& r) { r["schema_version"] = 2; }),
       "/schema_version: must be 1, got 2"},
      {"an unknown key", with([](json& r) { r["stages_measured"][0]["bogus"] = 1; }),
       "/stages_measured/0/bogus: unknown key"},
      {"another model", with([](json& r) { r["model"] = "llama-2-7b"; }),
       "/model: not a run of this plan: the run's model \"llama-2-7b\", the plan's model \"gpt2\" "
       "(--force compares them anyway)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    CHECK_THROWS_WITH_AS(planner::validate_json(p, c.run), c.message, core::InputError);
  }
  json bad = pipeline_run();
  bad["pipeline"]["schedule"] = "zigzag";
  CHECK_THROWS_AS(planner::validate_json(p, bad), core::InputError);
  // --force compares another model's run anyway and says so.
  bad = pipeline_run();
  bad["world"] = 4;
  bad["pipeline"]["data_parallel"] = 2;
  const auto forced = planner::validate_json(p, bad, true);
  REQUIRE(forced.contains("forced"));
  CHECK(forced["forced"][0] == "/world: the run's 4 ranks, the plan's 2 ranks");
}
