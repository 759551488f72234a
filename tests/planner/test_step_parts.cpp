// Properties of the one-dimensional walk that hold for any job: the step is the sum of the parts
// the report names, and memory does not fall when a rank's tokens grow. Through the command line,
// as users run it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

using shardplan::planner::testing::estimate;

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

namespace {

// The keys of an object, and of each object inside it whose keys are the document's (not names
// of categories, streams or collectives, which may differ with the plan).
std::vector<std::string> shape(const nlohmann::json& j, const std::string& at = "") {
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) {
    const std::string path = std::string(at).append("/").append(k);
    keys.push_back(path);
    if (v.is_object() && k != "exposed_by_stream_s" && k != "bytes_by_collective") {
      const auto inner = shape(v, path);
      keys.insert(keys.end(), inner.begin(), inner.end());
    }
    if (k == "stages" && !v.empty()) {
      const auto inner = shape(v.at(0), at + "/stages/0");
      keys.insert(keys.end(), inner.begin(), inner.end());
    }
  }
  return keys;
}

const std::vector<std::string> kLlama70b = {"--model",         "llama-3-70b",
                                            "--hardware",      "h100-sxm5-80gb",
                                            "--gpus",          "256",
                                            "--gpus-per-node", "8",
                                            "--seq-len",       "8192",
                                            "--global-batch",  "256",
                                            "--micro-batch",   "1"};

// Under torchtitan, whose trainer runs every dimension.
nlohmann::json estimate_70b(const std::string& strategy, std::vector<std::string> layout) {
  auto a = kLlama70b;
  a.insert(a.end(), {"--strategy", strategy, "--recipe", "torchtitan"});
  a.insert(a.end(), layout.begin(), layout.end());
  return estimate(a);
}

}  // namespace

TEST_CASE("step_parts::every layout is reported in one document") {
  // The data-parallel estimate and a 3D one have the same keys, down to a stage's; t = p = c = 1
  // given explicitly is the estimate without them, byte for byte.
  const auto one = estimate_70b("fsdp-full", {});
  const auto three = estimate_70b(
      "fsdp-full", {"--tensor-parallel", "8", "--sequence-parallel", "--pipeline-parallel", "4"});
  CHECK(shape(one) == shape(three));
  CHECK(one.at("schema_version") == 2);
  CHECK(one.at("stages").size() == 1);
  CHECK(three.at("stages").size() == 4);
  CHECK(one.at("parallelism").at("data_parallel") == 256);
  CHECK(three.at("parallelism").at("data_parallel") == 8);
  CHECK(three.at("fits").is_boolean());
  CHECK(three.at("verdict").is_string());
  CHECK(estimate_70b("fsdp-full", {"--tensor-parallel", "1", "--pipeline-parallel", "1",
                                   "--context-parallel", "1"}) == one);
  // The one stage of a data-parallel plan holds the plan's peak.
  CHECK(one.at("stages").at(0).at("peak_bytes") == one.at("memory").at("peak_bytes"));
}

TEST_CASE("step_parts::with model parallelism the step is compute, bubble and each dimension's "
          "waits") {
  // A grid of layouts: step = compute + pipeline bubble + exposed communication, and the exposed
  // communication is the sum of the dimensions' (tensor, context, pipeline, data); the bytes
  // sent are the sum of the dimensions' too. The peak is the largest stage's.
  int layouts = 0;
  for (const char* strategy : {"ddp", "zero1", "fsdp-full"})
    for (const char* t : {"1", "8"})
      for (const char* p : {"1", "4"})
        for (const char* c : {"1", "2"}) {
          std::vector<std::string> l = {"--tensor-parallel",  t, "--pipeline-parallel", p,
                                        "--context-parallel", c};
          if (std::string(t) != "1") l.emplace_back("--sequence-parallel");
          INFO(strategy << " t " << t << " p " << p << " c " << c);
          const auto e = estimate_70b(strategy, l);
          const auto& time = e.at("time");
          const double step = time.at("step_s").get<double>();
          double waits = 0;
          for (const auto& [dim, s] : time.at("exposed_by_dimension_s").items())
            waits += s.get<double>();
          CHECK(waits == doctest::Approx(time.at("exposed_comm_s").get<double>()).epsilon(1e-9));
          CHECK(time.at("compute_s").get<double>() + time.at("bubble_s").get<double>() + waits ==
                doctest::Approx(step).epsilon(1e-9));
          double bytes = 0;
          for (const auto& [dim, b] : e.at("comm").at("bytes_by_dimension").items())
            bytes += b.get<double>();
          CHECK(bytes == doctest::Approx(e.at("comm").at("bytes_per_gpu").get<double>()));
          double largest = 0;
          for (const auto& st : e.at("stages"))
            largest = std::max(largest, st.at("peak_bytes").get<double>());
          CHECK(largest == doctest::Approx(e.at("memory").at("peak_bytes").get<double>()));
          ++layouts;
        }
  CHECK(layouts == 24);
}

TEST_CASE("step_parts::with model parallelism memory never falls as a rank's tokens grow") {
  // Over layouts of tensor, pipeline and context parallelism and the recipes that run them, all
  // else equal: the peak grows with the sequence, but for the communication buffers in flight.
  // Those may shrink: where FSDP's collectives outlast the compute (short sequences), the next
  // unit's all-gather is issued while the last reduce-scatters are still running (llama-3-70b,
  // 256 GPUs, seq 1024 per rank: 26.5 GiB with 14.2 GiB of buffers at the embeddings' backward
  // gather; seq 2048: 25.4 GiB with 10.3 GiB). So a step's peak is bounded below by the shorter
  // one's less its buffers.
  // transformers' Trainer (hf) runs tensor and context parallelism only, without sequence
  // parallelism (documents/recipe.cpp).
  using Layouts = std::vector<std::vector<std::string>>;
  const Layouts every = {{"--tensor-parallel", "8", "--sequence-parallel"},
                         {"--pipeline-parallel", "4"},
                         {"--context-parallel", "2"},
                         {"--tensor-parallel", "4", "--sequence-parallel", "--pipeline-parallel",
                          "2", "--context-parallel", "2"}};
  const Layouts hf = {{"--tensor-parallel", "8"},
                      {"--context-parallel", "2"},
                      {"--tensor-parallel", "4", "--context-parallel", "2"}};
  int series = 0;
  for (const char* recipe : {"megatron", "torchtitan", "hf"})
    for (const char* strategy : {"ddp", "zero1", "fsdp-full"})
      for (const auto& layout : std::string(recipe) == "hf" ? hf : every) {
        double last = 0, last_buffers = 0;
        for (const char* seq : {"1024", "2048", "4096", "8192"}) {
          auto a = kLlama70b;
          a[9] = seq;  // --seq-len
          // (One checkpointing for every recipe.)
          a.insert(a.end(),
                   {"--strategy", strategy, "--recipe", recipe, "--checkpointing", "full"});
          a.insert(a.end(), layout.begin(), layout.end());
          INFO(std::string(recipe) << " " << std::string(strategy) << " " << layout.at(0) << " "
                                   << layout.at(1) << " seq " << std::string(seq));
          const auto m = estimate(a).at("memory");
          const double peak = m.at("peak_bytes").get<double>();
          CHECK(peak >= last - last_buffers);
          last = peak;
          last_buffers = m.at("breakdown").at("buffers").get<double>();
        }
        ++series;
      }
  CHECK(series == 33);
}
