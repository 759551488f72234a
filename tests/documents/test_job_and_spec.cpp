#include <doctest/doctest.h>

#include <utility>

#include "core/json_reader.hpp"
#include "documents/job.hpp"
#include "documents/sharding.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::documents;
using nlohmann::json;

namespace {
const json kJob = {{"schema_version", 1},       {"seq_len", 4096},      {"global_batch", 64},
                   {"precision", "bf16-mixed"}, {"optimizer", "adamw"}, {"checkpointing", "full"}};
}  // namespace

TEST_CASE("job::parses and round-trips") {
  const auto j = job_from_json(kJob);
  CHECK(j.seq_len == 4096);
  CHECK(j.checkpointing == Checkpointing::full);
  CHECK(j.micro_batch == 0);
  CHECK(job_to_json(j)["checkpointing"] == "full");
  CHECK(job_from_json(job_to_json(j)).global_batch == 64);
}

TEST_CASE("job::rejections name the field and value") {
  auto with = [](const char* key, json v) {
    json j = kJob;
    j[key] = std::move(v);
    return error_of([&] { job_from_json(j); });
  };
  CHECK(with("seq_len", 0) == "/seq_len: must be >= 1, got 0");
  CHECK(with("global_batch", -8) == "/global_batch: must be >= 1, got -8");
  CHECK(with("precision", "fp8") ==
        "/precision: must be one of fp32, bf16-mixed, fp16-mixed, bf16, got \"fp8\"");
  CHECK(with("optimizer", "lion") ==
        "/optimizer: must be one of adamw, adam, sgd, adafactor, got \"lion\"");
  CHECK(with("checkpointing", true) == "/checkpointing: must be a string, got true");
  CHECK(with("seq_lenn", 5) == "/seq_lenn: unknown key");
  CHECK(with("schema_version", 2) == "/schema_version: must be 1, got 2");
  // null is neither a value nor a key left out.
  CHECK(with("recipe", nullptr) == "/recipe: must not be null (leave the key out for its default)");
  CHECK(with("micro_batch", nullptr) ==
        "/micro_batch: must not be null (leave the key out for its default)");
  json missing = kJob;
  missing.erase("seq_len");
  CHECK(error_of([&] { job_from_json(missing); }) == "/seq_len: missing key");
}

TEST_CASE("job::recipe, loss and checkpointing modes: names, defaults and rejections") {
  auto parsed = [](json patch) {
    json j = kJob;
    for (auto it = patch.begin(); it != patch.end(); ++it) j[it.key()] = it.value();
    return job_from_json(j);
  };
  // The recipe's loss unless the document names one (llm-foundry's default is flash-attn's fused
  // cross-entropy; Megatron's vocab-parallel cross-entropy works in fp32 in place).
  CHECK(parsed({{"recipe", "llm-foundry"}}).loss == LossImpl::fused);
  CHECK(parsed({{"recipe", "megatron"}}).loss == LossImpl::fp32_inplace);
  CHECK(parsed({{"recipe", "llm-foundry"}, {"loss", "upcast"}}).loss == LossImpl::upcast);
  // torchtitan 0.3.0's Trainer checkpoints with its op-level SelectiveAC unless told otherwise.
  json titan = kJob;
  titan.erase("checkpointing");
  titan["recipe"] = "torchtitan";
  CHECK(job_from_json(titan).checkpointing == Checkpointing::selective_op);
  CHECK(parsed({{"recipe", "torchtitan"}}).checkpointing ==
        Checkpointing::full);  // kJob names full
  const auto every =
      parsed({{"checkpointing", "every:3"}, {"loss", "chunked:8"}, {"recipe", "torchtitan"}});
  CHECK(every.checkpointing == Checkpointing::every);
  CHECK(every.checkpoint_every == 3);
  CHECK(every.loss_chunks == 8);
  CHECK(job_to_json(every)["checkpointing"] == "every:3");
  CHECK(job_to_json(every)["loss"] == "chunked:8");
  CHECK(job_from_json(job_to_json(every)).checkpoint_every == 3);
  // "selective" is Megatron's attention-only recompute, under its own name.
  CHECK(parsed({{"checkpointing", "selective"}}).checkpointing ==
        Checkpointing::selective_attention);
  CHECK(parsed({{"checkpointing", "selective-op"}}).checkpointing == Checkpointing::selective_op);
  // Which blocks every:N checkpoints follows the recipe's code: transformers counts from layer 0
  // (layer_index % N == 0), torchtitan 0.2 from its N-th block.
  TrainingJob hf = every;
  hf.recipe = Recipe::hf;
  CHECK(hf.block_checkpointed(0));
  CHECK_FALSE(hf.block_checkpointed(2));
  CHECK(hf.block_checkpointed(3));
  CHECK_FALSE(every.block_checkpointed(0));
  CHECK(every.block_checkpointed(2));

  auto with = [](const char* key, json v) {
    json j = kJob;
    j[key] = std::move(v);
    return error_of([&] { job_from_json(j); });
  };
  CHECK(with("checkpointing", "every") ==
        "/checkpointing: every needs its count, e.g. \"every:2\"");
  CHECK(with("checkpointing", "every:0") ==
        "/checkpointing: every:N must be a whole number >= 1 after the colon, got \"every:0\"");
  CHECK(with("checkpointing", "every:x") ==
        "/checkpointing: every:N must be a whole number >= 1 after the colon, got \"every:x\"");
  CHECK(with("checkpointing", "layer") ==
        "/checkpointing: must be one of none, full, every:N, selective-attention, "
        "selective, selective-op, got \"layer\"");
  CHECK(with("loss", "chunked") == "/loss: chunked needs its count, e.g. \"chunked:8\"");
  CHECK(with("loss", "chunked:-2") ==
        "/loss: chunked:N must be a whole number >= 1 after the colon, got \"chunked:-2\"");
  CHECK(
      with("loss", "liger") ==
      "/loss: must be one of upcast, fused, chunked:N, fused-linear, fp32-inplace, got \"liger\"");
  CHECK(with("recipe", "nemo") == "/recipe: must be one of hf, torchtitan, llm-foundry, megatron, "
                                  "deepspeed, executor, got \"nemo\"");
  CHECK(with("recipe", 3) == "/recipe: must be a string, got 3");
}

TEST_CASE("job::cluster and batch say what would work") {
  CHECK(error_of([] {
          validate_cluster({12, 8});
        }) == "--gpus: 12 is not a multiple of --gpus-per-node 8; 8 or 16 would be");
  CHECK(error_of([] {
          validate_cluster({0, 8});
        }) == "--gpus: must be between 1 and 1000000, got 0");
  CHECK(error_of([] {
          validate_cluster({2000000, 8});
        }) == "--gpus: must be between 1 and 1000000, got 2000000");
  TrainingJob j;
  j.global_batch = 20;
  CHECK(error_of([&] {
          validate_job(j, {8, 8});
        }) == "--global-batch: 20 sequences do not divide over 8 GPUs; use a multiple of 8");
  j.global_batch = 32;
  j.micro_batch = 3;
  CHECK(error_of([&] {
          validate_job(j, {8, 8});
        }) ==
        "--micro-batch: 3 does not divide the 4 sequences per GPU (global batch 32 / 8 GPUs)");
}

TEST_CASE("sharding::presets shard what ZeRO's stages and FSDP's strategies shard") {
  const auto ddp = make_spec("ddp", std::nullopt, 8);
  CHECK_FALSE(ddp.shard_optimizer);
  CHECK(ddp.reduce_bucket_bytes == 25 * 1024 * 1024);  // torch DDP bucket_cap_mb = 25
  const auto z1 = make_spec("zero1", std::nullopt, 8);
  CHECK((z1.shard_optimizer && !z1.shard_gradients && !z1.shard_parameters));
  CHECK(z1.flavour == Flavour::deepspeed);
  const auto z2 = make_spec("zero2", std::nullopt, 8);
  CHECK((z2.shard_optimizer && z2.shard_gradients && !z2.shard_parameters));
  const auto z3 = make_spec("zero3", std::nullopt, 8);
  CHECK((z3.shard_parameters && z3.reshard_after_forward));
  CHECK(z3.persistence_threshold == 100000);  // stage3_param_persistence_threshold
  const auto grad_op = make_spec("fsdp-grad-op", std::nullopt, 8);
  CHECK((grad_op.shard_parameters && !grad_op.reshard_after_forward));
  CHECK(grad_op.flavour == Flavour::fsdp2);
  const auto full1 = make_spec("fsdp-full", Flavour::fsdp1, 8);
  CHECK(full1.keep_root_unsharded);
  CHECK(full1.max_inflight_allgathers == 2);  // limit_all_gathers
  const auto hsdp = make_spec("hsdp", std::nullopt, 8);
  CHECK(hsdp.shard_group_size == 8);
  CHECK(make_spec("hsdp", std::nullopt, 8, 4).group(64) == 4);
  CHECK(make_spec("zero3", std::nullopt, 8).group(64) == 64);
}

TEST_CASE("sharding::rejections") {
  CHECK(error_of([] { make_spec("zero4", std::nullopt, 8); }) ==
        "--strategy: must be one of ddp, zero1, zero2, zero3, fsdp-full, fsdp-grad-op, hsdp, "
        "none, got \"zero4\"");
  CHECK(error_of([] { make_spec("none", Flavour::fsdp2, 1); }) ==
        "--flavour: none is not implemented by fsdp2; use ddp");
  CHECK(error_of([] { make_spec("zero3", Flavour::fsdp2, 8); }) ==
        "--flavour: zero3 is not implemented by fsdp2; use deepspeed");
  CHECK(error_of([] { make_spec("zero3", std::nullopt, 8, 4); }) ==
        "--shard-group-size: applies to hsdp only, not zero3");
  CHECK(error_of([] { flavour_from_name("colossalai", "--flavour"); }) ==
        "--flavour: must be one of ddp, fsdp1, fsdp2, deepspeed, megatron, got \"colossalai\"");
}

TEST_CASE("sharding::plan json round trip and rejections") {
  const auto s = make_spec("hsdp", Flavour::fsdp1, 8, 4);
  const auto j = spec_to_json(s);
  const auto back = spec_from_json(j, "/spec");
  CHECK(spec_to_json(back) == j);
  json bad = j;
  bad["shard_group_size"] = -1;
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/shard_group_size: must be >= 0, got -1");
  bad = j;
  bad["reduce_dtype"] = "int8";
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/reduce_dtype: must be one of fp32, bf16, fp16, got \"int8\"");
  bad = spec_to_json(make_spec("ddp", std::nullopt, 8));
  bad["shard_gradients"] = true;
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/shard_gradients: sharding gradients needs sharded optimizer states (no framework "
        "does this)");
  // DeepSpeed's stages 1/2 all-reduce their buckets; a plan written before the key existed gets
  // the flavour's rule; the key on a strategy that does not keep partitions is refused.
  CHECK(make_spec("zero2", std::nullopt, 8).all_reduce_partitions);
  CHECK_FALSE(make_spec("zero3", std::nullopt, 8).all_reduce_partitions);
  CHECK_FALSE(make_spec("fsdp-grad-op", Flavour::fsdp2, 8).all_reduce_partitions);
  json old = spec_to_json(make_spec("zero1", std::nullopt, 8));
  old.erase("all_reduce_partitions");
  CHECK(spec_from_json(old, "/spec").all_reduce_partitions);
  bad = spec_to_json(make_spec("zero3", std::nullopt, 8));
  bad["all_reduce_partitions"] = true;
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/all_reduce_partitions: applies to ZeRO-1/2 (shard_optimizer without "
        "shard_parameters)");
  bad["all_reduce_partitions"] = "yes";
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }).rfind("/spec/all_reduce_partitions: ", 0) ==
        0);
}

// FSDP's mixed precision: the job names a mode by Composer's names (documents/job.hpp), the spec
// records the one setting the dtypes do not, fp32 gathering (Composer's FULL); a plan written
// before the key gathers in the compute dtype, and the key on another engine is refused.
TEST_CASE("sharding::FSDP mixed precision in the job and the plan") {
  json doc = kJob;
  doc["fsdp_mixed_precision"] = "full";
  const auto j = job_from_json(doc);
  REQUIRE(j.fsdp_mixed_precision);
  CHECK(*j.fsdp_mixed_precision == FsdpMixedPrecision::full);
  CHECK(job_to_json(j).at("fsdp_mixed_precision") == "full");
  CHECK_FALSE(job_to_json(job_from_json(kJob)).contains("fsdp_mixed_precision"));
  doc["fsdp_mixed_precision"] = "FULL";
  CHECK(error_of([&] { job_from_json(doc); }) ==
        "/fsdp_mixed_precision: must be one of default, pure, full, got \"FULL\"");
  doc["fsdp_mixed_precision"] = 1;
  CHECK(error_of([&] { job_from_json(doc); }) == "/fsdp_mixed_precision: must be a string, got 1");

  auto spec = make_spec("fsdp-full", Flavour::fsdp1, 8);
  spec.reduce_dtype = DType::fp32;
  CHECK(fsdp_mixed_precision(spec, DType::bf16) == FsdpMixedPrecision::default_mode);
  CHECK_FALSE(fsdp_mixed_precision(spec, DType::fp32));  // one dtype: no mode
  spec.fp32_gathered = true;
  CHECK(fsdp_mixed_precision(spec, DType::bf16) == FsdpMixedPrecision::full);
  CHECK(spec_from_json(spec_to_json(spec), "/spec").fp32_gathered);
  spec.fp32_gathered = false;
  spec.reduce_dtype = DType::bf16;
  CHECK(fsdp_mixed_precision(spec, DType::bf16) == FsdpMixedPrecision::pure);
  spec.reduce_dtype = DType::fp16;  // dtypes set one by one: none of the three
  CHECK_FALSE(fsdp_mixed_precision(spec, DType::bf16));
  json old = spec_to_json(spec);
  old.erase("fp32_gathered");
  CHECK_FALSE(spec_from_json(old, "/spec").fp32_gathered);
  json bad = spec_to_json(make_spec("zero3", std::nullopt, 8));
  bad["fp32_gathered"] = true;
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/fp32_gathered: applies to FSDP (fsdp1, fsdp2), not deepspeed");
}

// DeepSpeed's engine at stage 0 is the ddp strategy's deepspeed flavour (engine.py,
// allreduce_gradients); torch_optimizer, which DeepSpeed plans carry, round-trips and is refused
// elsewhere.
TEST_CASE("spec::DeepSpeed's stage 0 and the script's torch optimizer, and their rejections") {
  auto s0 = make_spec("ddp", Flavour::deepspeed, 8);
  CHECK(s0.flatten_to_reduce);
  CHECK_FALSE(s0.shard_optimizer);
  CHECK(reduces_after_backward(s0));
  CHECK(s0.reduce_bucket_bytes == 5e8 * 2);
  CHECK(fused_adam(s0));
  s0.torch_optimizer = true;
  CHECK_FALSE(fused_adam(s0));
  const auto back = spec_from_json(spec_to_json(s0), "/spec");
  CHECK(back.torch_optimizer);
  CHECK(back.flatten_to_reduce);  // follows from the flavour
  json old = spec_to_json(s0);
  old.erase("torch_optimizer");
  CHECK_FALSE(spec_from_json(old, "/spec").torch_optimizer);
  CHECK_FALSE(make_spec("ddp", std::nullopt, 8).flatten_to_reduce);  // torch's DDP by default
  json bad = spec_to_json(make_spec("fsdp-full", Flavour::fsdp2, 8));
  bad["torch_optimizer"] = true;
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/torch_optimizer: applies to DeepSpeed (deepspeed), not fsdp2");
  bad["torch_optimizer"] = "yes";
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/torch_optimizer: must be true or false, got \"yes\"");
}

// DeepSpeed's BF16_Optimizer (deepspeed/runtime/engine.py, _do_optimizer_sanity_check): bf16 at
// stage 1 with data_types.grad_accum_dtype fp32 and no offload, or at stage 0 under its pipeline
// engine; the grad_accum_dtype key round-trips and is refused elsewhere.
TEST_CASE("spec::DeepSpeed's BF16_Optimizer and grad_accum_dtype, and their rejections") {
  auto z1 = make_spec("zero1", Flavour::deepspeed, 8);
  CHECK_FALSE(runs_bf16_optimizer(z1, Precision::bf16_mixed, false));
  z1.grad_accum_dtype = DType::fp32;
  CHECK(runs_bf16_optimizer(z1, Precision::bf16_mixed, false));
  CHECK_FALSE(runs_bf16_optimizer(z1, Precision::fp16_mixed, false));
  z1.offload = Offload::optimizer;
  CHECK_FALSE(runs_bf16_optimizer(z1, Precision::bf16_mixed, false));
  const auto s0 = make_spec("ddp", Flavour::deepspeed, 8);
  CHECK(runs_bf16_optimizer(s0, Precision::bf16_mixed, true));
  CHECK_FALSE(runs_bf16_optimizer(s0, Precision::bf16_mixed, false));
  CHECK_FALSE(
      runs_bf16_optimizer(make_spec("zero2", Flavour::deepspeed, 8), Precision::bf16_mixed, true));
  // As the walk keeps it: a main-gradient buffer of the accumulation dtype beside the .grad,
  // the master partitioned, the buffer all-reduced whole.
  z1.offload = Offload::none;
  const auto b = as_bf16_optimizer(z1);
  CHECK(b.main_grad_buffer);
  CHECK(b.low_grads_kept);
  CHECK(b.shard_optimizer);
  CHECK(b.all_reduce_partitions);
  CHECK_FALSE(b.contiguous_grad_bucket);
  CHECK(reduces_after_backward(b));

  const auto back = spec_from_json(spec_to_json(z1), "/spec");
  REQUIRE(back.grad_accum_dtype);
  CHECK(*back.grad_accum_dtype == DType::fp32);
  CHECK(spec_to_json(make_spec("zero1", Flavour::deepspeed, 8))["grad_accum_dtype"].is_null());
  json bad = spec_to_json(z1);
  bad["grad_accum_dtype"] = "fp64";
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/grad_accum_dtype: must be one of fp32, bf16, fp16, got \"fp64\"");
  bad = spec_to_json(make_spec("fsdp-full", Flavour::fsdp2, 8));
  bad["grad_accum_dtype"] = "fp32";
  CHECK(error_of([&] { spec_from_json(bad, "/spec"); }) ==
        "/spec/grad_accum_dtype: applies to DeepSpeed (deepspeed), not fsdp2");
}

// FSDP2's groups: the job names them (documents/job.hpp, Fsdp2Groups), or leaves the recipe's.
TEST_CASE("job::FSDP2 groups in the job, and their rejections") {
  json doc = kJob;
  CHECK_FALSE(job_from_json(doc).fsdp2_groups);
  CHECK_FALSE(job_to_json(job_from_json(doc)).contains("fsdp2_groups"));
  doc["fsdp2_groups"] = "root";
  const auto j = job_from_json(doc);
  REQUIRE(j.fsdp2_groups);
  CHECK(*j.fsdp2_groups == Fsdp2Groups::root);
  CHECK(job_to_json(j).at("fsdp2_groups") == "root");
  doc["fsdp2_groups"] = "blocks";
  CHECK(error_of([&] { job_from_json(doc); }) ==
        "/fsdp2_groups: must be one of root, ends, got \"blocks\"");
  doc["fsdp2_groups"] = true;
  CHECK(error_of([&] { job_from_json(doc); }) == "/fsdp2_groups: must be a string, got true");
}
