// Properties of the one-dimensional walk that hold for any job: the step is the sum of the parts
// the report names, and memory does not fall when a rank's tokens grow. Through the command line,
// as users run it.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

using shardplan::planner::testing::planner;

nlohmann::json estimate(std::vector<std::string> args) {
  args.insert(args.begin(), "estimate");
  args.insert(args.end(), {"--format", "json"});
  const auto r = planner(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(r.out);
}

// compute_s + the exposed waits by stream, against step_s.
double unnamed_time(const nlohmann::json& e) {
  const auto& t = e.at("time");
  double parts = t.at("compute_s").get<double>();
  for (const auto& [stream, s] : t.at("exposed_by_stream_s").items()) parts += s.get<double>();
  return t.at("step_s").get<double>() - parts;
}

}  // namespace

TEST_CASE("step_parts::the step is its compute plus the waits the report names") {
  // The job that showed the gap: 16 micro-batches of ZeRO-2, whose reduce-scatters outlast each
  // micro-batch's compute (step 9.322 s against 3.186 s of named parts before).
  const auto gap =
      estimate({"--model", "mistral-7b", "--gpus", "8", "--seq-len", "2", "--micro-batch", "64",
                "--global-batch", "8192", "--strategy", "zero2", "--optimizer", "adam",
                "--checkpointing", "selective-op", "--hardware", "l40s-48gb"});
  CHECK(std::abs(unnamed_time(gap)) <= 1e-9 * gap.at("time").at("step_s").get<double>());
  CHECK(gap.at("time").at("exposed_comm_s").get<double>() ==
        doctest::Approx(gap.at("time").at("step_s").get<double>() -
                        gap.at("time").at("compute_s").get<double>()));
  int jobs = 0;
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp-full", "hsdp"})
    for (const char* accumulation : {"8", "64"})  // global batch: 1 or 8 micro-batches per GPU
      for (const char* seq : {"16", "4096"})
        for (const char* hw : {"a100-sxm4-80gb", "l40s-48gb"}) {
          CAPTURE(strategy);
          CAPTURE(accumulation);
          CAPTURE(seq);
          CAPTURE(hw);
          const auto e = estimate({"--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8",
                                   "--seq-len", seq, "--micro-batch", "1", "--global-batch",
                                   std::string(accumulation) == "8" ? "16" : "128", "--strategy",
                                   strategy, "--hardware", hw});
          CHECK(std::abs(unnamed_time(e)) <= 1e-9 * e.at("time").at("step_s").get<double>());
          ++jobs;
        }
  CHECK(jobs == 48);
}

TEST_CASE("step_parts::FSDP2 holds one reduce-scatter input at a time, so memory grows with the "
          "tokens") {
  // FSDP2 waits for the previous reduce-scatter before the next copy-in
  // (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, post_backward): with a short
  // sequence the reduce-scatters outlast the backward's compute, and the inputs must not pile up.
  // torchtitan reduces in fp32: one llama-2-7b block's input is 202,383,360 × 4 B = 0.75 GiB
  // (4·4096² + 3·4096·11008 + 2·4096 parameters), the root's (2·32000·4096 + 4096) × 4 B =
  // 0.98 GiB.
  auto buffers_at = [](const char* seq) {
    return estimate({"--model", "llama-2-7b", "--gpus", "8", "--seq-len", seq, "--micro-batch", "1",
                     "--global-batch", "8", "--strategy", "fsdp-full", "--recipe", "torchtitan"})
        .at("memory")
        .at("breakdown")
        .at("buffers")
        .get<double>();
  };
  // At most two gathered bf16 units, one fp32 reduce-scatter input and its output shard: under
  // 3 GiB (12.38 GiB of inputs piled up before).
  CHECK(buffers_at("64") < 3.0 * (1 << 30));
  double last = 0;
  for (const char* seq : {"128", "256", "512", "1024"}) {
    CAPTURE(seq);
    const double peak =
        estimate({"--model", "llama-3.1-405b", "--gpus", "64", "--seq-len", seq, "--micro-batch",
                  "1", "--global-batch", "64", "--strategy", "fsdp-full", "--recipe", "torchtitan",
                  "--hardware", "h100-sxm5-80gb"})
            .at("memory")
            .at("peak_bytes")
            .get<double>();
    CHECK(peak >= last);
    last = peak;
  }
}
