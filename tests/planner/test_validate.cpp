// planner validate: predicted against measured, with relative errors, from a plan document and a
// run document; malformed runs are refused naming the field.
#include <doctest/doctest.h>

#include <string>

#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "costmodel/parallel_step.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "documents/plan.hpp"
#include "documents/recipe.hpp"
#include "planner/validate.hpp"

using namespace shardplan;
using nlohmann::json;

namespace {

json plan_document() {
  documents::Plan p;
  p.model = documents::load_model("gpt2");
  p.hardware = "cpu-test";
  p.cluster = {2, 2};
  p.job.seq_len = 128;
  p.job.global_batch = 4;
  p.job.micro_batch = 2;
  p.job.precision = documents::Precision::fp32;
  p.job.attention = documents::AttentionImpl::eager;
  p.spec = documents::make_spec("fsdp-full", documents::Flavour::fsdp2, 2);
  p.prediction.peak_bytes = 1000;
  p.prediction.at_peak = {100, 200, 300, 400, 0, 0};
  p.prediction.step_s = 1.2;
  p.prediction.compute_s = 1.0;
  p.prediction.exposed_comm_s = 0.2;
  p.prediction.comm_bytes_per_gpu = 5000;
  p.prediction.peak_when = "backward of head";
  return documents::plan_to_json(p);
}

// A run document as the executor writes it, reduced to what validate reads plus the rest of the
// keys as they are named.
json run_document() {
  return {{"schema_version", 1},
          {"kind", "shardplan.run"},
          {"plan",
           {{"strategy", "fsdp-full"},
            {"flavour", "fsdp2"},
            {"hardware", "cpu-test"},
            {"model", "gpt2"},
            {"gpus", 2},
            {"job", {{"micro_batch", 2}}},
            {"sharding", json::object()}}},
          {"prediction", json::object()},
          {"environment",
           {{"backend", "mpi"},
            {"library", "x"},
            {"ranks", 2},
            {"hosts", {"a", "a"}},
            {"rehearsal", false},
            {"build", json::object()}}},
          {"model",
           {{"name", "gpt2"},
            {"params", 1},
            {"scaled", false},
            {"units", 14},
            {"config", json::object()}}},
          {"execution",
           {{"deviations", {"gradients are reduced in fp32"}},
            {"steps", 3},
            {"world_size", 2},
            {"seq_len", 128},
            {"micro_batch", 2}}},
          {"loss", {4.0, 3.9, 3.8}},
          {"ranks", json::array()},
          {"summary",
           {{"memory",
             {{"peak_bytes", 1250},
              {"rank", 1},
              {"at_peak",
               {{"parameters", 100},
                {"gradients", 200},
                {"optimizer_states", 300},
                {"activations", 650},
                {"buffers", 0},
                {"overhead", 0}}}}},
            {"time",
             {{"rank", 0},
              {"step_s", 1.5},
              {"compute_s", 0.9},
              {"optimizer_s", 0.1},
              {"copy_s", 0.05},
              {"collectives_s", 0.4},
              {"collectives_by_kind_s", json::object()},
              {"collective_time_excluded", false}}},
            {"comm_bytes_per_step", 4000}}}};
}

}  // namespace

TEST_CASE("validate::predicted against measured with relative errors") {
  const auto v = planner::validate_json(plan_document(), run_document());
  CHECK(v["memory"]["peak_predicted_bytes"] == 1000);
  CHECK(v["memory"]["peak_measured_bytes"] == 1250);
  CHECK(v["memory"]["peak_rel_error"].get<double>() ==
        doctest::Approx(-0.2));  // (1000 − 1250) / 1250
  CHECK(v["memory"]["categories"]["parameters"]["rel_error"].get<double>() == 0);
  CHECK(v["memory"]["categories"]["activations"]["rel_error"].get<double>() ==
        doctest::Approx(400.0 / 650 - 1));
  CHECK(v["memory"]["categories"]["buffers"]["rel_error"].get<double>() ==
        0);  // 0 predicted, 0 measured
  CHECK(v["time"]["step_rel_error"].get<double>() == doctest::Approx(1.2 / 1.5 - 1));
  // Predicted compute includes the optimizer: compared with compute + optimizer measured.
  CHECK(v["time"]["parts"]["compute"]["measured_s"].get<double>() == doctest::Approx(1.0));
  CHECK(v["time"]["parts"]["compute"]["rel_error"].get<double>() == doctest::Approx(0.0));
  CHECK(v["time"]["parts"]["communication"]["rel_error"].get<double>() ==
        doctest::Approx(0.2 / 0.4 - 1));
  CHECK(v["time"]["parts"]["other"]["measured_s"].get<double>() == doctest::Approx(0.1));
  CHECK(v["time"]["comm_bytes"]["rel_error"].get<double>() == doctest::Approx(0.25));
  REQUIRE(v["notes"].size() == 1);
  CHECK(v["notes"][0].get<std::string>().find("reduced in fp32") != std::string::npos);

  const auto table = planner::validate_table(plan_document(), run_document());
  CHECK(table.find("peak memory error -20.0%, step time error -20.0%") != std::string::npos);
  CHECK(table.find("activations") != std::string::npos);
}

TEST_CASE("validate::says when numbers are not comparable") {
  auto run = run_document();
  run["model"]["scaled"] = true;
  run["environment"]["rehearsal"] = true;
  run["summary"]["time"]["collective_time_excluded"] = true;
  run["summary"]["memory"]["at_peak"]["buffers"] = 10;
  run["summary"]["memory"]["at_peak"]["activations"] = 0;
  run["summary"]["memory"]["peak_bytes"] = 610;  // the categories' sum, as a run reports it
  const auto v = planner::validate_json(plan_document(), run);
  CHECK(v["notes"].size() == 3);
  CHECK_FALSE(v.contains("forced"));
  CHECK(v["memory"]["categories"]["buffers"]["rel_error"].get<double>() == -1);  // none predicted
  CHECK(v["memory"]["categories"]["activations"]["rel_error"].is_null());        // none measured
}

TEST_CASE("validate::a GPU run: exposed communication is the compute's wait, MFU and device") {
  auto run = run_document();
  auto& time = run["summary"]["time"];
  // On a GPU, collectives_s is the time to queue them; comm_wait_s the compute's stall on them.
  time["comm_wait_s"] = 0.25;
  time["comm_wait_by_stream_s"] = {{"all_gather", 0.15}, {"reduce", 0.1}, {"replica", 0.0}};
  time["collectives_overlap"] = true;
  run["environment"]["backend"] = "nccl";
  time["model_flops_per_step"] = 3e14;
  time["achieved_TFLOPs"] = 200.0;  // 3e14 / 1.5 s
  time["peak_TFLOPs"] = 494.5;
  time["mfu"] = 200.0 / 494.5;
  run["summary"]["memory"]["device"] = {
      {"reserved_peak_bytes", 1100}, {"cuda_context_bytes", 100}, {"nccl_workspace_bytes", 50}};
  run["environment"]["device"] = "NVIDIA H200";
  const auto v = planner::validate_json(plan_document(), run);
  CHECK(v["time"]["parts"]["communication"]["measured_s"].get<double>() == 0.25);
  CHECK(v["time"]["parts"]["communication"]["rel_error"].get<double>() ==
        doctest::Approx(0.2 / 0.25 - 1));
  // other = step − (compute + optimizer) − the wait = 1.5 − 1.0 − 0.25
  CHECK(v["time"]["parts"]["other"]["measured_s"].get<double>() == doctest::Approx(0.25));
  CHECK(v["time"]["mfu"].get<double>() == doctest::Approx(200.0 / 494.5));
  CHECK(v["time"]["parts"]["communication"]["by_stream_s"]["all_gather"] == 0.15);
  CHECK(v["memory"]["device"]["cuda_context_bytes"] == 100);
  const auto table = planner::validate_table(plan_document(), run);
  CHECK(table.find("MFU") != std::string::npos);
  CHECK(table.find("40.4%") != std::string::npos);  // 200 / 494.5
  // A rehearsal on a GPU has no NCCL communicator: validate says its workspace is missing.
  run["environment"]["rehearsal"] = true;
  const auto notes = planner::validate_json(plan_document(), run)["notes"];
  bool said = false;
  for (const auto& n : notes)
    said = said || n.get<std::string>().find("NCCL workspace") != std::string::npos;
  INFO(notes.dump());
  CHECK(said);
  // A negative stall is refused naming the field.
  time["comm_wait_s"] = -1;
  CHECK_THROWS_AS(planner::validate_json(plan_document(), run), core::InputError);
}

TEST_CASE("validate::--hardware is refused for a run compared with the plan's own prediction") {
  const auto hw = documents::load_hardware("h100-sxm5-80gb");
  try {
    planner::validate_json(plan_document(), run_document(), false, &hw);
    FAIL("accepted --hardware for a data-parallel run");
  } catch (const core::InputError& e) {
    CHECK(e.where() == "--hardware");
  }
}

TEST_CASE("validate::a malformed run is refused naming the field") {
  auto run = run_document();
  run["summary"]["time"].erase("step_s");
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       "/summary/time/step_s: missing key", core::InputError);
  run = run_document();
  run["kind"] = "shardplan.plan";
  CHECK_THROWS_AS(planner::validate_json(plan_document(), run), core::InputError);
  run = run_document();
  run["surprise"] = 1;
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run), "/surprise: unknown key",
                       core::InputError);
  CHECK_THROWS_AS(planner::validate_json(run_document(), run_document()), core::InputError);
  // Numbers no run reports: a rank the run does not have, a fraction of a byte, a peak that is
  // not its categories at the peak.
  run = run_document();
  run["summary"]["memory"]["rank"] = 99;
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       "/summary/memory/rank: 99 is not a rank of the run's 2 (/environment/ranks)",
                       core::InputError);
  run = run_document();
  run["summary"]["time"]["rank"] = 2;
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       "/summary/time/rank: 2 is not a rank of the run's 2 (/environment/ranks)",
                       core::InputError);
  run = run_document();
  run["summary"]["memory"]["peak_bytes"] = 5.5;
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       "/summary/memory/peak_bytes: must be a whole number of bytes, got 5.5",
                       core::InputError);
  run["summary"]["memory"]["peak_bytes"] = 5;
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       "/summary/memory/peak_bytes: 5 is not the sum of the categories at the "
                       "peak (1250)",
                       core::InputError);
}

TEST_CASE("validate::a run of another plan is refused naming the field, --force compares anyway") {
  struct Case {
    const char* pointer;
    json value;
    const char* difference;
  };
  const Case cases[] = {
      {"/plan/model", "llama-2-7b", "the run's model \"llama-2-7b\", the plan's model \"gpt2\""},
      {"/environment/ranks", 8, "the run's 8 ranks, the plan's 2 ranks"},
      {"/plan/strategy", "ddp", "the run's ddp, the plan's fsdp-full"},
      {"/plan/flavour", "fsdp1", "the run's fsdp1, the plan's fsdp2"},
      {"/plan/job/micro_batch", 1, "the run's micro-batch 1, the plan's micro-batch 2"},
      // What the executor ran, edited apart from the plan it records.
      {"/execution/world_size", 1024, "the run's 1024 ranks, the plan's 2 ranks"},
      {"/execution/seq_len", 4096,
       "the run's sequence length 4096, the plan's sequence length 128"},
      {"/execution/micro_batch", 8, "the run's micro-batch 8, the plan's micro-batch 2"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.pointer);
    auto run = run_document();
    run[json::json_pointer(c.pointer)] = c.value;
    const std::string named = std::string(c.pointer) + ": " + c.difference;
    CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                         (std::string(c.pointer) + ": not a run of this plan: " + c.difference +
                          " (--force compares them anyway)")
                             .c_str(),
                         core::InputError);
    CHECK_THROWS_AS(planner::validate_table(plan_document(), run), core::InputError);
    const auto forced = planner::validate_json(plan_document(), run, true);
    REQUIRE(forced["forced"].size() == 1);
    CHECK(forced["forced"][0] == named);
    const auto table = planner::validate_table(plan_document(), run, true);
    CHECK(table.rfind("forced (--force): not a run of this plan (" + named + ")", 0) == 0);
  }
  // Another model and strategy at once (the case): every difference is said.
  auto run = run_document();
  run["plan"]["model"] = "llama-2-7b";
  run["plan"]["strategy"] = "zero3";
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       doctest::Contains("/plan/model: "), core::InputError);
  CHECK(planner::validate_json(plan_document(), run, true)["forced"].size() == 2);
  // A run of this plan is compared with or without --force, and says nothing of it.
  CHECK_FALSE(planner::validate_json(plan_document(), run_document(), true).contains("forced"));
  CHECK(planner::validate_table(plan_document(), run_document(), true).rfind("plan: ", 0) == 0);
}

TEST_CASE("validate::exposed communication is the compute's wait where collectives overlapped") {
  // A CPU run: blocking collectives are exposed whole (collectives_s, whatever comm_wait_s says);
  // with collective streams (collectives_overlap) the exposed part is the compute's wait; a run
  // document without the key overlapped them only on the NCCL backend.
  auto run = run_document();
  auto& time = run["summary"]["time"];
  const double queued_or_blocking = time["collectives_s"].get<double>();
  time["comm_wait_s"] = 0.0;
  time["collectives_overlap"] = false;
  auto measured = [&] {
    return planner::validate_json(plan_document(),
                                  run)["time"]["parts"]["communication"]["measured_s"]
        .get<double>();
  };
  CHECK(measured() == queued_or_blocking);
  time["comm_wait_s"] = 0.05;
  time["collectives_overlap"] = true;
  CHECK(measured() == 0.05);
  time.erase("collectives_overlap");
  CHECK(measured() == queued_or_blocking);  // an mpi run of an older executor
  run["environment"]["backend"] = "nccl";
  CHECK(measured() == 0.05);
}

TEST_CASE("validate::real CPU runs: blocking collectives are the measured communication") {
  // Written by the executor with MPI on 2 CPU ranks (tests/planner/data/cpu_run: the plan of
  // tests/executor/data/llama-tiny.json on cpu-test, fsdp-full, fp32; run.json with blocking
  // collectives, streams.json with --collective-streams). A blocking run's compute never waits on
  // another thread, so its comm_wait_s is 0: its exposed communication is all of collectives_s.
  const std::string dir = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/planner/data/cpu_run/";
  const auto plan = core::read_json_file(dir + "plan.json");
  const auto blocking = core::read_json_file(dir + "run.json");
  const auto& t = blocking["summary"]["time"];
  REQUIRE(t["collectives_overlap"] == false);
  REQUIRE(t["comm_wait_s"] == 0.0);
  double by_kind = 0;
  for (const auto& [kind, s] : t["collectives_by_kind_s"].items()) by_kind += s.get<double>();
  REQUIRE(by_kind > 0);
  const auto v = planner::validate_json(plan, blocking);
  const auto& comm = v["time"]["parts"]["communication"];
  CHECK(comm["measured_s"].get<double>() == t["collectives_s"].get<double>());
  CHECK(comm["measured_as"] == "summary.time.collectives_s");
  CHECK(comm["measured_s"].get<double>() == doctest::Approx(by_kind));
  CHECK_FALSE(comm["rel_error"].is_null());
  const auto table = planner::validate_table(plan, blocking);
  const auto line =
      table.substr(table.find("  communication"),
                   table.find('\n', table.find("  communication")) - table.find("  communication"));
  CHECK(line.find("n/a") == std::string::npos);
  CHECK(line.find(" 0.0000 ") == std::string::npos);

  // With collective streams the compute's wait is the exposed part.
  const auto streams = core::read_json_file(dir + "streams.json");
  REQUIRE(streams["summary"]["time"]["collectives_overlap"] == true);
  const auto waited = planner::validate_json(plan, streams)["time"]["parts"]["communication"];
  CHECK(waited["measured_s"] == streams["summary"]["time"]["comm_wait_s"]);
  CHECK(waited["measured_as"] == "summary.time.comm_wait_s");
}

TEST_CASE("validate::a tensor-parallel run: the memory predicted for the run's t") {
  // The run document of executor --tensor-parallel 2 names t in /model/tensor_parallel; the
  // plan's prediction (data parallelism) is replaced by the step walk's one stage for t = 2 (its
  // profile "cpu-test" is not loadable here: no per-device overheads).
  auto run = run_document();
  run["model"]["tensor_parallel"] = {{"size", 2}, {"sequence_parallel", true}, {"local_params", 1}};
  const auto plan = documents::plan_from_json(plan_document());
  documents::HardwareProfile hw;
  costmodel::StepInput in;
  in.model = &plan.model;
  in.hardware = &hw;
  in.cluster = plan.cluster;
  in.job = plan.job;
  in.spec = plan.spec;
  documents::ParallelLayout layout;
  layout.tensor_parallel = 2;
  layout.sequence_parallel = true;
  layout.micro_batches = 2;                     // 4 sequences over 1 replica, 2 at a time
  in.job.recipe = documents::Recipe::executor;  // what the run ran
  in.job.loss = documents::recipe_traits(in.job.recipe).loss;
  const double want = costmodel::simulate_parallel_step(in, layout).step.peak_bytes;
  const auto v = planner::validate_json(plan_document(), run);
  CHECK(v["memory"]["peak_predicted_bytes"].get<double>() == doctest::Approx(want));
  CHECK(v["memory"]["peak_rel_error"].get<double>() == doctest::Approx((want - 1250) / 1250));
  CHECK(v["memory"]["tensor_parallel"]["size"] == 2);
  CHECK(v["memory"]["tensor_parallel"]["predicted_by"] ==
        "the step walk (simulate_parallel_step), one stage");
  bool executor_said = false;  // the plan's recipe (hf) is not the code that ran
  for (const auto& n : v["notes"])
    executor_said |= n.get<std::string>() ==
                     "the plan was costed for the hf recipe's code; the run's memory is predicted "
                     "for the executor's, which ran";
  CHECK(executor_said);
  bool said = false;
  for (const auto& n : v["notes"])
    said |= n.get<std::string>().find("the plan's step time is for tensor parallelism 1") !=
            std::string::npos;
  CHECK(said);
  run["model"]["tensor_parallel"]["size"] = 0;
  CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), run),
                       "/model/tensor_parallel/size: must be >= 1, got 0", core::InputError);
}

TEST_CASE("validate::a context-parallel run: the memory predicted for the run's c") {
  // executor --context-parallel 2 names c in /model/context_parallel: the prediction is
  // the step walk's one stage for c = 2, and the plan's own (c = 1) is said to differ.
  auto run = run_document();
  run["model"]["context_parallel"] = {{"size", 2}, {"sequence_share", 8}};
  run["execution"]["seq_len"] = 64;  // the rank's half of each sequence, as the executor says it
  // The executor's ring runs flash attention only (executor/run_setup.cpp).
  json flash = plan_document();
  flash["job"]["attention"] = "flash";
  const auto plan = documents::plan_from_json(flash);
  documents::HardwareProfile hw;
  costmodel::StepInput in;
  in.model = &plan.model;
  in.hardware = &hw;
  in.cluster = plan.cluster;
  in.job = plan.job;
  in.spec = plan.spec;
  documents::ParallelLayout layout;
  layout.context_parallel = 2;
  layout.micro_batches = 2;                     // 4 sequences over 1 replica, 2 at a time
  in.job.recipe = documents::Recipe::executor;  // what the run ran
  in.job.loss = documents::recipe_traits(in.job.recipe).loss;
  const double want = costmodel::simulate_parallel_step(in, layout).step.peak_bytes;
  const auto v = planner::validate_json(flash, run);
  CHECK(v["memory"]["peak_predicted_bytes"].get<double>() == doctest::Approx(want));
  CHECK(v["memory"]["context_parallel"]["size"] == 2);
  CHECK(v["plan"]["peak_when"] == "the one stage with context parallelism 2");
  bool said = false;
  for (const auto& n : v["notes"])
    said |= n.get<std::string>().find("context parallelism 1, the run's are 1 and 2") !=
            std::string::npos;
  CHECK(said);
  struct Bad {
    const char* field;
    nlohmann::json value;
    const char* message;
  };
  for (const auto& b :
       {Bad{"size", 0, "/model/context_parallel/size: must be >= 1, got 0"},
        Bad{"sequence_share", 0, "/model/context_parallel/sequence_share: must be >= 1, got 0"},
        Bad{"size", "2", "/model/context_parallel/size: must be an integer, got \"2\""}}) {
    auto bad = run;
    bad["model"]["context_parallel"][b.field] = b.value;
    CHECK_THROWS_WITH_AS(planner::validate_json(plan_document(), bad), b.message, core::InputError);
  }
  auto extra = run;
  extra["model"]["context_parallel"]["rank"] = 1;
  CHECK_THROWS_AS(planner::validate_json(plan_document(), extra), core::InputError);
}
