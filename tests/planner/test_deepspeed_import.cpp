// Reading a user's DeepSpeed config: the sample configs import, every key is understood, stated
// as an assumption or rejected with its JSON pointer.
#include <doctest/doctest.h>

#include <string>

#include "core/json_reader.hpp"
#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "planner/deepspeed_import.hpp"
#include "planner/estimate.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan;
using namespace shardplan::costmodel;
using namespace shardplan::core;
using namespace shardplan::documents;
using nlohmann::json;
using planner::DeepSpeedImport;
using planner::Scenario;

namespace {

Scenario scenario() {
  Scenario sc;
  sc.model = load_model("llama-2-7b");
  sc.hardware = load_hardware("a100-sxm4-80gb");
  sc.cluster = {8, 8};
  sc.job.seq_len = 4096;
  sc.job.global_batch = 32;
  return sc;
}

DeepSpeedImport import(const json& ds, const Scenario& sc = scenario()) {
  return planner::import_deepspeed_config(ds, sc);
}

std::string import_error(const json& ds, const Scenario& sc = scenario()) {
  return error_of([&] { import(ds, sc); });
}

DeepSpeedImport import_example(const std::string& name, const Scenario& sc = scenario()) {
  return import(read_json_file(std::string(SHARDPLAN_SOURCE_DIR) + "/examples/deepspeed/" + name),
                sc);
}

bool says(const DeepSpeedImport& d, const std::string& part) {
  for (const auto& a : d.assumptions)
    if (a.find(part) != std::string::npos) return true;
  return false;
}

const json kZero2 = {{"train_batch_size", 32},
                     {"train_micro_batch_size_per_gpu", 2},
                     {"bf16", {{"enabled", true}}},
                     {"zero_optimization", {{"stage", 2}}}};

json with(json base, const json::json_pointer& at, json value) {
  base[at] = std::move(value);
  return base;
}

}  // namespace

TEST_CASE("deepspeed_import::Hugging Face Trainer zero3 config with auto values") {
  const auto d = import_example("hf-trainer-zero3-auto.json");
  CHECK(d.spec.strategy == "zero3");
  CHECK(d.spec.flavour == Flavour::deepspeed);
  CHECK(d.spec.offload == Offload::none);
  CHECK(d.job.global_batch == 32);  // "auto": the scenario's
  CHECK(d.job.micro_batch == 0);    // "auto" without --micro-batch: the planner chooses
  CHECK(d.job.precision == Precision::bf16_mixed);
  CHECK(d.job.optimizer == Optimizer::adamw);
  // The Trainer's fill from hidden size 4096: h², 0.9·h², 10·h.
  CHECK(d.spec.reduce_bucket_bytes == 4096.0 * 4096 * 2);
  CHECK(d.spec.prefetch_bucket_elems == 15099494);
  CHECK(d.spec.persistence_threshold == 40960);
  CHECK(d.spec.reduce_dtype == DType::bf16);
  CHECK(says(d, "/zero_optimization/reduce_bucket_size \"auto\": 16777216 from the model's hidden "
                "size 4096"));
  CHECK(says(d, "/bf16/enabled \"auto\": true from the scenario's precision bf16-mixed"));
  CHECK(says(d, "/fp16/enabled \"auto\": false"));
  CHECK(says(
      d, "train_micro_batch_size_per_gpu \"auto\" and no --micro-batch: the planner chooses it"));
  CHECK(says(d, "/optimizer/params ignored"));
  CHECK(says(d, "/scheduler ignored"));
  CHECK(says(d, "/gradient_clipping ignored"));
  CHECK(says(d, "/steps_per_print ignored"));
  CHECK(says(d, "/zero_optimization/sub_group_size ignored"));
  // The example's stage3_max_reuse_distance 1e9, read (DeepSpeed keeps a gathered unit whose
  // next use is nearer than that many elements: partitioned_param_coordinator.py).
  CHECK(d.spec.reuse_distance_elems == 1e9);
  CHECK(!says(d, "/zero_optimization/stage3_max_reuse_distance ignored"));
  CHECK(says(d, "/zero_optimization/stage3_gather_16bit_weights_on_model_save ignored"));
  CHECK(says(d, "the scenario's --checkpointing none"));

  // With the scenario's micro-batch and precision, "auto" takes those.
  auto sc = scenario();
  sc.job.micro_batch = 2;
  sc.job.precision = Precision::fp16_mixed;
  const auto e = import_example("hf-trainer-zero3-auto.json", sc);
  CHECK(e.job.micro_batch == 2);
  CHECK(e.job.precision == Precision::fp16_mixed);
  CHECK(e.spec.reduce_dtype == DType::fp16);
  // And it evaluates.
  sc.job = e.job;
  const auto ev = planner::evaluate(sc, e.spec, e.job);
  CHECK(ev.result.valid);
  CHECK(ev.result.grad_accumulation == 2);
}

TEST_CASE("deepspeed_import::zero2 with CPU optimizer offload") {
  const auto d = import_example("zero2-offload-bf16.json");
  CHECK(d.spec.strategy == "zero2");
  CHECK(d.spec.offload == Offload::optimizer);
  CHECK(d.job.global_batch == 64);
  CHECK(d.job.micro_batch == 2);
  CHECK(d.job.precision == Precision::bf16_mixed);
  CHECK(d.spec.reduce_bucket_bytes == 2e8 * 2);
  CHECK(d.spec.allgather_bucket_bytes == 2e8 * 2);
  CHECK(says(d, "train_batch_size 64 replaces the scenario's global batch 32"));
  // 2e8 elements x 2 bytes = 4e8 B = 381.47 MiB.
  CHECK(says(d, "/zero_optimization/overlap_comm true at stage 2: DeepSpeed then keeps a second "
                "reduce bucket that the model does not count (memory under-predicted by 381.47 MiB "
                "per GPU)"));
  auto sc = scenario();
  sc.job = d.job;
  const auto e = planner::evaluate(sc, d.spec, d.job);
  CHECK(e.result.valid);
  CHECK(e.result.grad_accumulation == 4);
}

TEST_CASE("deepspeed_import::zero1 fp16 with only micro-batch and accumulation") {
  const auto d = import_example("zero1-fp16.json");
  CHECK(d.spec.strategy == "zero1");
  CHECK(d.job.micro_batch == 4);
  CHECK(d.job.global_batch == 4 * 2 * 8);  // micro x accumulation x GPUs
  CHECK(d.job.precision == Precision::fp16_mixed);
  CHECK(d.spec.reduce_dtype == DType::fp32);  // communication_data_type
  CHECK(d.spec.reduce_bucket_bytes == 5e8 * 4);
  CHECK(says(d, "/fp16 loss-scaling settings ignored"));
  CHECK(says(d, "/tensorboard ignored: logging"));
  CHECK(says(d, "no optimizer section: the training script's optimizer, assumed torch.optim's "
                "adamw"));
  CHECK(d.spec.torch_optimizer);
}

TEST_CASE("deepspeed_import::batch keys follow DeepSpeed's rules") {
  auto batch = [](json keys) {
    keys["zero_optimization"] = {{"stage", 1}};
    const auto d = import(keys);
    return std::pair{d.job.global_batch, d.job.micro_batch};
  };
  CHECK(batch({{"train_micro_batch_size_per_gpu", 4}}) ==
        std::pair<std::int64_t, std::int64_t>{32, 4});
  CHECK(batch({{"train_batch_size", 64}}) == std::pair<std::int64_t, std::int64_t>{64, 8});
  CHECK(batch({{"train_batch_size", 64}, {"gradient_accumulation_steps", 4}}) ==
        std::pair<std::int64_t, std::int64_t>{64, 2});
  CHECK(batch({{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 2}}) ==
        std::pair<std::int64_t, std::int64_t>{64, 2});
  CHECK(batch({{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", "auto"}}) ==
        std::pair<std::int64_t, std::int64_t>{32, 1});
}

TEST_CASE("deepspeed_import::inconsistent batches say what would work") {
  CHECK(
      import_error({{"train_batch_size", 64},
                    {"train_micro_batch_size_per_gpu", 2},
                    {"gradient_accumulation_steps", 2}}) ==
      "/train_batch_size: 64 is not train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps "
      "2 x 8 GPUs = 32; use train_batch_size 32 or gradient_accumulation_steps 4");
  CHECK(
      import_error({{"train_batch_size", 36}, {"train_micro_batch_size_per_gpu", 2}}) ==
      "/train_batch_size: 36 is not a multiple of train_micro_batch_size_per_gpu 2 x 8 GPUs = 16; "
      "use 32 or 48");
  CHECK(import_error({{"train_batch_size", 20}}) ==
        "/train_batch_size: 20 is not a multiple of 8 GPUs; use 16 or 24");
  CHECK(import_error({{"train_batch_size", 4}}) ==
        "/train_batch_size: 4 is not a multiple of 8 GPUs; use 8");
  CHECK(import_error({{"train_batch_size", "auto"},
                      {"train_micro_batch_size_per_gpu", 3},
                      {"gradient_accumulation_steps", 1}}) ==
        "/train_batch_size: \"auto\" (the scenario's global batch 32) is not "
        "train_micro_batch_size_per_gpu 3 x gradient_accumulation_steps 1 x 8 GPUs = 24; use "
        "train_batch_size 24");
  // Each key alone is within its 1e9 bound; their product (1e18 x 8 GPUs) is beyond int64 and
  // was once computed in it (found by fuzz_deepspeed_import).
  CHECK(import_error({{"train_micro_batch_size_per_gpu", 1'000'000'000},
                      {"gradient_accumulation_steps", 1'000'000'000}}) ==
        "/gradient_accumulation_steps: train_micro_batch_size_per_gpu 1000000000 x "
        "gradient_accumulation_steps 1000000000 x 8 GPUs is over 1000000000 sequences per step");
  CHECK(import_error({{"zero_optimization", {{"stage", 2}}}}) ==
        "/train_batch_size: missing: give train_batch_size or train_micro_batch_size_per_gpu (or "
        "\"auto\" to take the scenario's)");
}

TEST_CASE("deepspeed_import::rejections name the JSON pointer") {
  using P = json::json_pointer;
  CHECK(import_error(with(kZero2, P("/zero_optimization/foo"), 1)) ==
        "/zero_optimization/foo: unknown key");
  CHECK(import_error(with(kZero2, P("/train_batch_sise"), 1)) == "/train_batch_sise: unknown key");
  CHECK(import_error(with(kZero2, P("/zero_optimization/stage"), 4)) ==
        "/zero_optimization/stage: must be 0, 1, 2 or 3, got 4");
  CHECK(import_error(with(kZero2, P("/zero_optimization/stage"), "3")) ==
        "/zero_optimization/stage: must be an integer, got \"3\"");
  CHECK(import_error(with(kZero2, P("/train_micro_batch_size_per_gpu"), "two")) ==
        "/train_micro_batch_size_per_gpu: must be an integer or \"auto\", got \"two\"");
  CHECK(import_error(with(kZero2, P("/train_micro_batch_size_per_gpu"), 0)) ==
        "/train_micro_batch_size_per_gpu: must be >= 1, got 0");
  CHECK(import_error(with(kZero2, P("/zero_optimization/overlap_comm"), 1)) ==
        "/zero_optimization/overlap_comm: must be true or false, got 1");
  CHECK(import_error(with(kZero2, P("/zero_optimization/reduce_bucket_size"), "big")) ==
        "/zero_optimization/reduce_bucket_size: must be a number or \"auto\", got \"big\"");
  CHECK(import_error(with(kZero2, P("/zero_optimization/reduce_bucket_size"), -1)) ==
        "/zero_optimization/reduce_bucket_size: must be >= 0, got -1");
  CHECK(
      import_error(with(kZero2, P("/zero_optimization/allgather_bucket_size"), "auto")) ==
      "/zero_optimization/allgather_bucket_size: must be a number (the Hugging Face Trainer fills "
      "\"auto\" only for reduce_bucket_size, stage3_prefetch_bucket_size and "
      "stage3_param_persistence_threshold), got \"auto\"");
  CHECK(
      import_error(with(kZero2, P("/zero_optimization/offload_optimizer"), {{"device", "nvme"}})) ==
      "/zero_optimization/offload_optimizer/device: NVMe offload is not modelled; use \"cpu\" (or "
      "\"none\")");
  CHECK(
      import_error(with(kZero2, P("/zero_optimization/offload_optimizer"), {{"device", "gpu"}})) ==
      "/zero_optimization/offload_optimizer/device: must be one of none, cpu, nvme, got \"gpu\"");
  CHECK(import_error(with(kZero2, P("/zero_optimization/offload_optimizer"),
                          {{"device", "cpu"}, {"speed", 1}})) ==
        "/zero_optimization/offload_optimizer/speed: unknown key");
  CHECK(import_error(with(kZero2, P("/zero_optimization/offload_param"), {{"device", "cpu"}})) ==
        "/zero_optimization/offload_param: DeepSpeed offloads parameters only at stage 3, got "
        "stage 2");
  auto z3 = with(kZero2, P("/zero_optimization/stage"), 3);
  CHECK(import_error(with(z3, P("/zero_optimization/offload_param"), {{"device", "cpu"}})) ==
        "/zero_optimization/offload_param: offloading parameters without the optimizer is not "
        "modelled; add \"offload_optimizer\": {\"device\": \"cpu\"}");
  CHECK(import_error(with(kZero2, P("/fp16"), {{"enabled", true}})) ==
        "/fp16/enabled: bf16 and fp16 cannot both be enabled");
  CHECK(import_error(with(kZero2, P("/bf16/enabled"), "yes")) ==
        "/bf16/enabled: must be true or false, got \"yes\"");
  CHECK(import_error(with(kZero2, P("/communication_data_type"), "int8")) ==
        "/communication_data_type: must be one of fp16, bf16, fp32, got \"int8\"");
  CHECK(
      import_error(with(kZero2, P("/optimizer"), {{"type", "Shampoo"}})) ==
      "/optimizer/type: must be one of Adam, AdamW, SGD, Adafactor, Lamb, OneBitAdam, ZeroOneAdam, "
      "OneBitLamb, Lion, Adagrad, Muon, got \"Shampoo\"");
  CHECK(import_error(with(kZero2, P("/pipeline"), {{"stages", 2}})) ==
        "/pipeline: is a DeepSpeed feature the planner does not model; remove it to estimate the "
        "data-parallel plan");
  CHECK(import_error(with(kZero2, P("/amp"), {{"enabled", true}})) ==
        "/amp/enabled: amp mixed precision is not modelled; use bf16 or fp16");
  CHECK(import_error(with(kZero2, P("/zero_optimization/zero_quantized_weights"), true)) ==
        "/zero_optimization/zero_quantized_weights: ZeRO++/MiCS features are not modelled; remove "
        "it");
  CHECK(import_error(with(kZero2, P("/zero_optimization"), true)) ==
        "/zero_optimization: must be an object, got true");
  CHECK(import_error(json::array()) == "/: must be an object, got []");
}

TEST_CASE("deepspeed_import::knobs map onto the spec") {
  using P = json::json_pointer;
  auto z3 = with(kZero2, P("/zero_optimization"),
                 {{"stage", 3},
                  {"stage3_max_live_parameters", 1e8},
                  {"prefetch_bucket_size", 1e7},
                  {"param_persistence_threshold", 0},
                  {"cpu_offload", true},
                  {"cpu_offload_param", true}});
  const auto d = import(z3);
  CHECK(d.spec.strategy == "zero3");
  CHECK(d.spec.offload == Offload::params);
  CHECK(d.spec.prefetch_bucket_elems == 1e7);
  CHECK(d.spec.persistence_threshold == 0);
  CHECK(d.spec.max_inflight_allgathers == 1);  // 1e8 is under one llama-2-7b block (202M)
  CHECK(says(d, "stage3_max_live_parameters 100000000 is under two blocks"));
  CHECK(says(d, "/zero_optimization/cpu_offload is deprecated"));

  auto z0 = with(kZero2, P("/zero_optimization/stage"), 0);
  z0["zero_optimization"]["reduce_bucket_size"] = 1e6;
  const auto ddp = import(z0);
  CHECK(ddp.spec.strategy == "ddp");
  // DeepSpeed's own stage-0 engine: its runs of 5e8 elements flattened to all-reduce, whatever
  // reduce_bucket_size says (engine.py, MEMORY_OPT_ALLREDUCE_SIZE), in bf16 (kZero2's "bf16").
  CHECK(ddp.spec.flavour == Flavour::deepspeed);
  CHECK(ddp.spec.flatten_to_reduce);
  CHECK(ddp.spec.reduce_bucket_bytes == 5e8 * 2);
  CHECK(ddp.spec.torch_optimizer);  // kZero2 names no optimizer: the script passes its own
  CHECK(says(ddp, "/zero_optimization/reduce_bucket_size ignored: not used at stage 0"));

  const auto lion =
      import(with(kZero2, P("/optimizer"), {{"type", "Lion"}, {"params", {{"lr", 1e-4}}}}));
  CHECK(lion.job.optimizer == Optimizer::sgd);
  CHECK(says(lion, "/optimizer/type Lion: one state per parameter"));

  const auto fp32 = import({{"train_batch_size", 32}, {"zero_optimization", {{"stage", 1}}}});
  CHECK(fp32.job.precision == Precision::fp32);
  CHECK(fp32.spec.reduce_dtype == DType::fp32);
  CHECK(says(fp32, "no bf16 or fp16 enabled: fp32 training"));

  json old = kZero2;
  old.erase("bf16");
  old["bfloat16"] = {{"enabled", true}};
  const auto old_name = import(old);
  CHECK(old_name.job.precision == Precision::bf16_mixed);

  const auto disabled = import(with(kZero2, P("/sparse_attention"), {{"enabled", false}}));
  CHECK(says(disabled, "/sparse_attention ignored: not enabled"));
}

TEST_CASE("deepspeed_import::how stages 1/2 reduce their gradients") {
  // DeepSpeed 0.19.8's stage_1_and_2.py, average_tensor: each bucket is all-reduced and every
  // rank keeps its partition (use_multi_rank_bucket_allreduce, default true; reduce_scatter
  // false all-reduces as well); with use_multi_rank_bucket_allreduce false, one reduce per rank's
  // partition. Stage 3 reduce-scatters whatever the keys say (stage3.py, __avg_scatter_grads).
  using P = json::json_pointer;
  CHECK(import(kZero2).spec.all_reduce_partitions);
  const auto per_rank =
      import(with(kZero2, P("/zero_optimization/use_multi_rank_bucket_allreduce"), false));
  CHECK_FALSE(per_rank.spec.all_reduce_partitions);
  CHECK(says(per_rank, "use_multi_rank_bucket_allreduce false: one reduce per rank's partition"));
  auto no_rs = with(kZero2, P("/zero_optimization/use_multi_rank_bucket_allreduce"), false);
  no_rs["zero_optimization"]["reduce_scatter"] = false;
  CHECK(import(no_rs).spec.all_reduce_partitions);
  auto z3 = with(kZero2, P("/zero_optimization/stage"), 3);
  z3["zero_optimization"]["reduce_scatter"] = false;
  z3["zero_optimization"]["use_multi_rank_bucket_allreduce"] = true;
  const auto stage3 = import(z3);
  CHECK_FALSE(stage3.spec.all_reduce_partitions);
  CHECK(says(stage3, "reduce_scatter false: stage 3 reduce-scatters the gradients regardless"));
  CHECK(says(stage3, "use_multi_rank_bucket_allreduce ignored: stage 3"));
  // The emitted config says what the plan counted.
  CHECK(import(kZero2).spec.all_reduce_partitions ==
        documents::make_spec("zero2", Flavour::deepspeed, 8).all_reduce_partitions);
}

TEST_CASE(
    "deepspeed_import::the config's micro-batch and optimizer replacing the user's are stated") {
  // zero2-offload-bf16.json: train_micro_batch_size_per_gpu 2 and an AdamW optimizer section.
  auto sc = scenario();
  sc.job.micro_batch = 4;             // --micro-batch 4
  sc.job.optimizer = Optimizer::sgd;  // --optimizer sgd
  const auto d = import_example("zero2-offload-bf16.json", sc);
  CHECK(d.job.micro_batch == 2);
  CHECK(says(d, "micro-batch 2 from the config replaces the scenario's 4"));
  CHECK(d.job.optimizer != Optimizer::sgd);
  CHECK(says(d, "from the config replaces the scenario's sgd"));
}

// data_types (deepspeed/runtime/config.py, DtypeEnum's names): grad_accum_dtype fp32 with bf16 at
// stage 1 makes the engine run BF16_Optimizer (engine.py, _do_optimizer_sanity_check); DeepSpeed
// itself refuses a stage-0 mix and a param_dtype that is not the enabled one; ZeRO's own fp32
// accumulation (stage_1_and_2.py, use_grad_accum_attribute) and the other keys are not modelled.
TEST_CASE("deepspeed_import::data_types: BF16_Optimizer's fp32 accumulation, and rejections") {
  using P = json::json_pointer;
  auto z1 = with(kZero2, P("/zero_optimization/stage"), 1);
  const auto bf16 = import(with(z1, P("/data_types"), {{"grad_accum_dtype", "fp32"}}));
  REQUIRE(bf16.spec.grad_accum_dtype);
  CHECK(*bf16.spec.grad_accum_dtype == DType::fp32);
  CHECK(runs_bf16_optimizer(bf16.spec, bf16.job.precision, false));
  CHECK(says(bf16, "/data_types/grad_accum_dtype fp32: bf16 at stage 1 runs BF16_Optimizer"));
  // DeepSpeed's other spellings, and the model's own dtype (no change).
  CHECK(*import(with(z1, P("/data_types"), {{"grad_accum_dtype", "torch.float32"}}))
             .spec.grad_accum_dtype == DType::fp32);
  const auto same = import(with(z1, P("/data_types"), {{"grad_accum_dtype", "bfloat16"}}));
  CHECK_FALSE(runs_bf16_optimizer(same.spec, same.job.precision, false));
  CHECK_FALSE(
      import(with(z1, P("/data_types"), {{"grad_accum_dtype", nullptr}})).spec.grad_accum_dtype);

  CHECK(import_error(with(z1, P("/data_types"), {{"grad_accum_dtype", "fp64"}})) ==
        "/data_types/grad_accum_dtype: must be one of fp32, bf16, fp16, got \"fp64\"");
  CHECK(import_error(with(z1, P("/data_types"), {{"grad_accum_dtype", 32}})) ==
        "/data_types/grad_accum_dtype: must be a string, got 32");
  CHECK(import_error(with(z1, P("/data_types"), {{"param_dtype", "fp16"}})) ==
        "/data_types/param_dtype: fp16 does not match the enabled bf16 (DeepSpeed refuses it)");
  CHECK(import_error(with(kZero2, P("/data_types"), {{"grad_accum_dtype", "fp32"}})) ==
        "/data_types/grad_accum_dtype: fp32 with a bf16 model at stage 2 is not modelled (only "
        "bf16 at stage 1 with fp32, BF16_Optimizer, without offload)");
  CHECK(import_error(with(with(kZero2, P("/zero_optimization/stage"), 0), P("/data_types"),
                          {{"grad_accum_dtype", "fp32"}})) ==
        "/data_types/grad_accum_dtype: fp32 with a bf16 model at stage 0: DeepSpeed raises "
        "NotImplementedError (unsupported mix)");
  CHECK(import_error(with(z1, P("/data_types"), {{"buffer_dtype", "fp32"}})) ==
        "/data_types/buffer_dtype: is not modelled; leave it out");
  CHECK(import_error(with(z1, P("/data_types"), {{"grad_acc_dtype", "fp32"}})) ==
        "/data_types/grad_acc_dtype: unknown key");
  CHECK(import_error(with(z1, P("/data_types"), 1)) == "/data_types: must be an object, got 1");
  CHECK(import_error(with(z1, P("/data_types"), {{"grad_accum_dtype", "Float64"}})) ==
        "/data_types/grad_accum_dtype: must be one of fp32, bf16, fp16, got \"Float64\"");

  // bf16's immediate_grad_update is BF16_Optimizer's alone: refused where the plan runs it (each
  // bf16 gradient then released as it is accumulated, not modelled), ignored with a word elsewhere.
  const auto immediate = with(with(z1, P("/data_types"), {{"grad_accum_dtype", "fp32"}}),
                              P("/bf16/immediate_grad_update"), true);
  CHECK(import_error(immediate) ==
        "/bf16/immediate_grad_update: true: BF16_Optimizer then releases each bf16 gradient as it "
        "is accumulated, which is not modelled; leave it false (its default)");
  const auto zero2 = import(with(kZero2, P("/bf16/immediate_grad_update"), true));
  CHECK(says(zero2, "/bf16/immediate_grad_update ignored: only BF16_Optimizer reads it, which "
                    "this plan does not run"));
  CHECK_FALSE(says(import(with(immediate, P("/bf16/immediate_grad_update"), false)),
                   "immediate_grad_update"));
}
