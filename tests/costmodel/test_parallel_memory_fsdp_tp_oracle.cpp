// parallel_memory under torchtitan's 2-D layout, FSDP2 over tensor parallelism, against what
// PyTorch allocates (validation/measure_fsdp_tp.py: tests/costmodel/data/oracle_fsdp_tp.json).
// 4 gloo CPU ranks on a (dp_shard = 2, tp = 2) DeviceMesh: torchtitan's sequence-parallel TP
// layout on HF's Llama (llama-h256), then fully_shard on the embedding, each block, [final norm,
// head] and the root as torchtitan's apply_fsdp calls it without a pipeline (reshard_after_forward
// True but for the [norm, head] group); fp32 and bf16 parameters (MixedPrecisionPolicy with fp32
// reduction), foreach AdamW, FSDPMemTracker over the second step.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "costmodel/parallel_memory.hpp"
#include "oracle_corpus.hpp"

using namespace shardplan::costmodel;
using nlohmann::json;

namespace {

// The job and plan of a corpus case, predicted by parallel_memory for one rank.
StageMemory predict(const json& corpus, const json& c) {
  const std::string config = c.at("config").get<std::string>();
  const ModelSpec m = model_from_hf_config(corpus.at("configs").at(config), config);
  HardwareProfile hw;  // measured on CPU ranks; the corpus counts tensors only: no context,
  hw.is_cpu = true;    // NCCL workspace or fragmentation
  const int t = c.at("tensor_parallel").get<int>();
  const int world = c.at("world_size").get<int>();
  ParallelMemoryInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {world, world};
  in.job.seq_len = c.at("seq_len").get<std::int64_t>();
  in.job.micro_batch = c.at("micro_batch").get<std::int64_t>();
  in.job.global_batch = in.job.micro_batch * (world / t);
  const bool bf16 = c.at("precision") == "bf16-mixed";
  in.job.precision = bf16 ? Precision::bf16_mixed : Precision::fp32;
  in.job.attention = AttentionImpl::flash;
  in.job.optimizer = Optimizer::adamw;
  in.job.recipe = Recipe::torchtitan;
  in.job.loss = default_loss(in.job.recipe);
  set_checkpointing(in.job, c.at("checkpointing").get<std::string>(), "checkpointing");
  in.spec = make_spec("fsdp-full", Flavour::fsdp2, world);
  // torchtitan's MixedPrecisionPolicy reduces in fp32 (mixed_precision_reduce); fp32 runs reduce
  // in their parameters' dtype.
  in.spec.reduce_dtype = DType::fp32;
  in.layout.tensor_parallel = t;
  in.layout.sequence_parallel = c.at("sequence_parallel").get<bool>();
  const auto walk = walk_schedule(PipelineSchedule::one_f_one_b, 1, 1, 1, {1.0}, {2.0});
  return parallel_memory(in, walk).stages.at(0);
}

double at_peak(const json& c, const char* key) {
  const auto& a = c.at("at_peak");
  return a.contains(key) ? a.at(key).get<double>() : 0.0;
}

}  // namespace

// Every case: the peak within 1% of rank 0's measured peak; the moment the one the measured
// categories name (the loss's backward when the tracker was outside every module, the embedding's
// gradient on its way to the reduce-scatter when unsharded gradients were alive in the first
// block's backward); the sharded parameters, sharded gradients and optimizer states (with the
// foreach intermediate) within 1% of themselves; FSDP's own buffers (gathered parameters,
// unsharded gradients, reduce-scatter and all-gather buffers) covered by the prediction's buffers,
// which also hold the gradient's shard copy and cast that the tracker files under temp; buffers
// and activations together within 1% of the peak of what the tracker counts beside the states.
TEST_CASE("parallel_memory::FSDP2 over torchtitan's sequence-parallel TP (2-D, dp_shard 2 x tp "
          "2): every corpus peak within 1%") {
  const json corpus = shardplan::oracle::read_corpus("oracle_fsdp_tp.json");
  std::string table = fmt::format("{:<46} {:>11} {:>11} {:>7}  {}\n", "case", "measured",
                                  "predicted", "error", "moment");
  int cases = 0;
  double worst = 0;
  for (const auto& c : corpus.at("cases")) {
    ++cases;
    const StageMemory s = predict(corpus, c);
    const double predicted = s.total();
    const double measured = c.at("peak_bytes").get<double>();
    const double error = (predicted - measured) / measured;
    worst = std::max(worst, std::abs(error));
    const std::string id = c.at("id").get<std::string>();
    table += fmt::format("{:<46} {:>11.0f} {:>11.0f} {:>6.2f}%  {}\n", id, measured, predicted,
                         100 * error, s.moment);
    INFO(id << ": predicted " << predicted << " at " << s.moment << ", measured " << measured
            << " in " << c.at("peak_module").get<std::string>());
    CHECK(std::abs(error) < 0.01);
    CHECK(c.at("peak_phase") == "backward");
    const bool loss = c.at("peak_module") == "Global";
    if (loss) {
      CHECK(s.moment == "loss backward");
    } else {
      CHECK(at_peak(c, "unsharded_gradients") > 0);
      CHECK(s.moment.starts_with("embedding"));
    }
    CHECK(s.param_bytes == doctest::Approx(at_peak(c, "sharded_parameters")).epsilon(0.01));
    CHECK(s.grad_bytes == doctest::Approx(at_peak(c, "sharded_gradients")).epsilon(0.01));
    CHECK(s.optimizer_bytes ==
          doctest::Approx(at_peak(c, "optimizer_states") + at_peak(c, "optimizer_temp"))
              .epsilon(0.01));
    const double fsdp = at_peak(c, "unsharded_parameters") + at_peak(c, "unsharded_gradients") +
                        at_peak(c, "all_gather") + at_peak(c, "reduce_scatter");
    const double temp = at_peak(c, "temp");
    CHECK(s.buffer_bytes >= fsdp - 0.01 * measured);
    CHECK(s.buffer_bytes <= fsdp + temp + 0.01 * measured);
    const double rest = fsdp + temp + at_peak(c, "activations") + at_peak(c, "inputs") +
                        at_peak(c, "other") + at_peak(c, "buffers");
    CHECK(std::abs(s.buffer_bytes + s.activation_bytes - rest) <= 0.01 * measured);
  }
  CHECK(cases == 16);
  MESSAGE("FSDP2 x TP corpus, worst peak error " << 100 * worst << "%\n" << table);
}

// The model states by hand for llama-h256 (h = 256, 8 heads of 32 over 2 key/value heads,
// I = 704, V = 4096, 4 blocks, untied) under t = 2 and FSDP over 2: per TP rank the row-wise
// embedding 524,288, each block 352,256 + 512 (its two norms whole), the head 524,288 and the
// final norm 256: 2,459,904 elements, 1,229,952 per rank after FSDP, the corpus's local_params.
// fp32 AdamW: 4 bytes of parameter and 8 of moments per element; the sharded gradients at the
// optimizer step 4 per element (the row-wise table's whole [V, h] gradient is not kept).
TEST_CASE("parallel_memory::FSDP2 over TP: the sharded model states, hand-derived") {
  const json corpus = shardplan::oracle::read_corpus("oracle_fsdp_tp.json");
  for (const auto& c : corpus.at("cases")) {
    if (c.at("id") != "fsdp2-tp2-sp/llama-h256/fp32/none/s128-b1") continue;
    const double E = 1229952;
    CHECK(c.at("local_params").get<double>() == E);
    const StageMemory s = predict(corpus, c);
    CHECK(s.param_bytes == 4 * E);
    CHECK(s.optimizer_bytes == 8 * E);  // the peak is not the optimizer step's
    CHECK(s.moment == "embedding backward");
    // Everything but the embedding's shard (1024 x 256) already reduced.
    CHECK(s.grad_bytes == 4 * (E - 262144));
    return;
  }
  FAIL("the corpus has no fsdp2-tp2-sp/llama-h256/fp32/none/s128-b1 case");
}
