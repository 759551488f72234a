// A model-parallel layout as torchtitan, Megatron-LM and DeepSpeed run it, and as the plan
// document. The option names are the frameworks' own, checked in:
//   torchtitan 0.3.0 (PyPI): torchtitan/config/configs.py, ParallelismConfig (data_parallel_
//     replicate_degree, data_parallel_shard_degree, tensor_parallel_degree, enable_sequence_
//     parallel, pipeline_parallel_degree, pipeline_parallel_schedule, pipeline_parallel_layers_
//     per_stage, pipeline_parallel_first_stage_less_layers, pipeline_parallel_last_stage_less_
//     layers, pipeline_parallel_microbatch_size, context_parallel_degree) and CompileConfig
//     (enable, enable_async_tensor_parallel); torchtitan 0.2.2 (PyPI): torchtitan/config/
//     job_config.py, class Parallelism (the same names, enable_async_tensor_parallel among them);
//   Megatron-LM core_v0.19.0: megatron/training/arguments.py and the dataclass fields it turns
//     into arguments (megatron/core/model_parallel_config.py: tensor_model_parallel_size,
//     sequence_parallel, pipeline_model_parallel_size, context_parallel_size, tp_comm_overlap;
//     megatron/training/config/training_config.py: micro_batch_size, global_batch_size;
//     megatron/core/transformer/transformer_config.py: recompute_granularity, recompute_method,
//     recompute_num_layers; megatron/training/config/common_config.py: use_torch_fsdp2);
//   DeepSpeed v0.19.5: deepspeed/runtime/pipe/engine.py (ZeRO stage < 2 under a pipeline; the
//     "pipeline" config's activation_checkpoint_interval), deepspeed/runtime/config.py.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "documents/plan.hpp"
#include "documents/recipe.hpp"
#include "planner/emit_parallel.hpp"
#include "planner/estimate.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using shardplan::test::error_of;
using namespace shardplan::planner;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

Scenario llama70b(int gpus, std::int64_t global) {
  Scenario sc;
  sc.model = load_model("llama-3-70b");
  sc.hardware = load_hardware("h100-sxm5-80gb");
  sc.cluster = {gpus, 8};
  sc.job.seq_len = 8192;
  sc.job.global_batch = global;
  sc.job.recipe = Recipe::megatron;
  sc.job.loss = LossImpl::fp32_inplace;
  return sc;
}

// Tensor 8 with sequence parallel, pipeline 4 interleaved x5 (80 layers / 20 chunks = 4 blocks a
// chunk), 8 micro-batches of 1: 256 / 32 = 8 replicas, 8 x 8 x 1 = 64 sequences.
// The strategy under the recipe's engine (Megatron's DDP and distributed optimizer, FSDP2) unless
// a flavour is named.
LayoutCandidate interleaved(const Scenario& sc, const char* strategy,
                            std::optional<Flavour> flavour = std::nullopt) {
  LayoutCandidate c;
  c.layout.tensor_parallel = 8;
  c.layout.sequence_parallel = true;
  c.layout.pipeline_parallel = 4;
  c.layout.schedule = PipelineSchedule::interleaved_1f1b;
  c.layout.virtual_stages = 5;
  c.layout.micro_batches = 8;
  c.job = sc.job;
  c.job.micro_batch = 1;
  c.spec =
      make_spec(strategy, flavour.value_or(recipe_traits(sc.job.recipe).flavour_for(strategy)), 8);
  c.result = simulate_parallel_step(step_input(sc, c.spec, c.job), c.layout);
  return c;
}

}  // namespace

TEST_CASE("parallel_emit::torchtitan options of an FSDP2 + TP + interleaved PP layout") {
  const auto sc = llama70b(256, 64);
  const auto c = interleaved(sc, "fsdp-full");
  // local_batch_size: a replica's 8 micro-batches of pipeline_parallel_microbatch_size 1; stages =
  // ceil((80 + 0 + 0) / 4) = 20 = 4 ranks x 5 (torchtitan/distributed/pipeline_parallel.py).
  CHECK(
      torchtitan_options(sc, c) ==
      "--training.local_batch_size 8 --training.global_batch_size 64 --training.seq_len 8192 "
      "--training.mixed_precision_param bfloat16 "
      "--parallelism.data_parallel_replicate_degree 1 --parallelism.data_parallel_shard_degree 8 "
      "--parallelism.tensor_parallel_degree 8 --parallelism.pipeline_parallel_degree 4 "
      "--parallelism.pipeline_parallel_schedule Interleaved1F1B "
      "--parallelism.pipeline_parallel_layers_per_stage 4 "
      "--parallelism.pipeline_parallel_first_stage_less_layers 0 "
      "--parallelism.pipeline_parallel_last_stage_less_layers 0 "
      "--parallelism.pipeline_parallel_microbatch_size 1 --parallelism.context_parallel_degree 1");
  const auto text = torchtitan_parallel_settings(sc, c);
  CHECK(contains(text, "# ---- torchtitan 0.2.x (checked: 0.2.2)"));
  CHECK(contains(text, "[parallelism]\ndata_parallel_replicate_degree = 1\n"
                       "data_parallel_shard_degree = 8\ntensor_parallel_degree = 8\n"));
  CHECK(contains(text, "pipeline_parallel_schedule = \"Interleaved1F1B\"\n"));
  CHECK(contains(text, "[activation_checkpoint]\nmode = \"none\"\n"));
  CHECK(contains(text, "# ---- torchtitan 0.3.0 command line"));
  CHECK(contains(text, "torchrun --nnodes 32 --nproc_per_node 8 -m torchtitan.train"));
  CHECK(contains(text, "  activation_checkpoint:none\n"));
  // Async TP: 0.2.2 a parallelism option beside [compile] enable; 0.3.0 CompileConfig's.
  auto async = c;
  async.layout.async_tensor_parallel = true;
  const auto a = torchtitan_parallel_settings(sc, async);
  CHECK(contains(a, "enable_async_tensor_parallel = true\n"));
  CHECK(contains(a, "[compile]\nenable = true\n"));
  CHECK(contains(a, "  --compile.enable \\\n  --compile.enable_async_tensor_parallel \\\n"));
}

TEST_CASE("parallel_emit::an uneven pipeline split as each framework writes it, or refuses") {
  // torchtitan's own split of 80 blocks over 4 x 5 parts with the embeddings and the head counted
  // as a block each: 82 effective layers, ceil(82 / 20) = 5 a part, ceil(82 / 5) = 17 parts: not
  // 20, so layers_per_stage cannot say it. Over 4 x 2 parts: ceil(82 / 8) = 11 a part,
  // ceil(82 / 11) = 8 parts: torchtitan makes them (its split is documents::pipeline_parts').
  const auto sc = llama70b(256, 64);
  auto c = interleaved(sc, "fsdp-full");
  c.layout.first_stage_less_layers = c.layout.last_stage_less_layers = 1;
  CHECK(error_of([&] { torchtitan_parallel_settings(sc, c); }) ==
        "--emit: torchtitan's pipeline_parallel_layers_per_stage cannot make 20 model parts of 80 "
        "layers (+ 1 and 1 for the embeddings and the head)");
  c.layout.virtual_stages = 2;
  const auto options = torchtitan_options(sc, c);
  CHECK(contains(options, "--parallelism.pipeline_parallel_layers_per_stage 11 "
                          "--parallelism.pipeline_parallel_first_stage_less_layers 1 "
                          "--parallelism.pipeline_parallel_last_stage_less_layers 1 "));
  // Megatron-LM (with DDP: it refuses FSDP2 under a pipeline): 82 does not divide over 8 parts.
  auto ddp = c;
  ddp.spec = make_spec("ddp", Flavour::megatron, 8);
  CHECK(contains(error_of([&] { megatron_parallel_arguments(sc, ddp); }),
                 "Megatron-LM splits the layers evenly over the 8 model parts"));
  // 1F1B over 2 stages: 82 over 2 = 41 a part: --account-for-embedding/loss-in-pipeline-split.
  auto two = c;
  two.layout.schedule = PipelineSchedule::one_f_one_b;
  two.layout.virtual_stages = 1;
  two.layout.pipeline_parallel = 2;
  two.spec = make_spec("ddp", Flavour::megatron, 8);
  const auto args = megatron_parallel_arguments(sc, two);
  CHECK(contains(args, "--pipeline-model-parallel-size 2 \\\n"
                       "  --account-for-embedding-in-pipeline-split \\\n"
                       "  --account-for-loss-in-pipeline-split \\\n"));
}

TEST_CASE("parallel_emit::what torchtitan cannot run is said, not emitted") {
  const auto sc = llama70b(256, 64);
  const auto zero1 = interleaved(sc, "zero1");
  CHECK(torchtitan_options(sc, zero1).empty());
  CHECK(error_of([&] { torchtitan_parallel_settings(sc, zero1); }) ==
        "--emit: torchtitan has no zero1 (optimizer-only sharding): its data parallelism is DDP, "
        "FSDP2 or HSDP");
  // DDP beside TP and PP: 0.2.2's llama3 parallelize.py raises "DDP has not supported > 1D
  // parallelism"; 0.3.0 runs it as replicate degree 8, shard degree 1.
  const auto ddp = interleaved(sc, "ddp", Flavour::ddp);
  const auto text = torchtitan_parallel_settings(sc, ddp);
  CHECK(contains(text, "# not expressible in torchtitan 0.2.x: 0.2.x runs DDP only as the one "
                       "parallelism"));
  CHECK_FALSE(contains(text, "[parallelism]"));
  CHECK(contains(text, "  --parallelism.data_parallel_replicate_degree 8 \\\n"
                       "  --parallelism.data_parallel_shard_degree 1 \\\n"));
}

TEST_CASE("parallel_emit::Megatron-LM arguments, and FSDP2 under a pipeline refused") {
  const auto sc = llama70b(256, 64);
  // --use-distributed-optimizer: Megatron's ZeRO-1; Llama 3 does not tie its embeddings.
  CHECK(megatron_arguments(sc, interleaved(sc, "zero1")) ==
        "--tensor-model-parallel-size 8 --sequence-parallel --pipeline-model-parallel-size 4 "
        "--num-layers-per-virtual-pipeline-stage 4 --context-parallel-size 1 --micro-batch-size 1 "
        "--global-batch-size 64 --seq-length 8192 --use-distributed-optimizer "
        "--untie-embeddings-and-output-weights --bf16");
  // --grad-reduce-in-bf16: the main gradients and their reduction in bf16, as the plan counts.
  auto bf16_grads = interleaved(sc, "zero1");
  bf16_grads.spec.reduce_dtype = DType::bf16;
  CHECK(contains(megatron_arguments(sc, bf16_grads),
                 "--use-distributed-optimizer --grad-reduce-in-bf16 "));
  // A plan that reduces its buffer in buckets beside the backward says so.
  auto overlap = interleaved(sc, "zero1");
  overlap.spec = with_overlap_grad_reduce(overlap.spec, 8);
  CHECK(contains(megatron_arguments(sc, overlap),
                 "--use-distributed-optimizer --overlap-grad-reduce "));
  // A plan costed with DeepSpeed's ZeRO-1 (bf16 gradients) or torch's DDP (a bucket copy) is not
  // Megatron's: refused, naming the engine; and Megatron's plan is not DeepSpeed's.
  CHECK(error_of([&] {
          megatron_parallel_arguments(sc, interleaved(sc, "zero1", Flavour::deepspeed));
        }) ==
        "--emit: this layout was costed with deepspeed's zero1; Megatron-LM runs its own DDP and "
        "distributed optimizer (--recipe megatron plans with them)");
  CHECK(cannot_express(ParallelFramework::deepspeed, sc, interleaved(sc, "ddp")) ==
        "this layout was costed with Megatron-core's DDP (fp32 main gradients); DeepSpeed's engine "
        "keeps other buffers");
  const auto fsdp = interleaved(sc, "fsdp-full");
  CHECK(megatron_arguments(sc, fsdp).empty());
  CHECK(error_of([&] { megatron_parallel_arguments(sc, fsdp); }) ==
        "--emit: Megatron-LM refuses --use-torch-fsdp2 with pipeline parallelism "
        "(megatron/training/arguments.py)");
  // One stage: FSDP2 beside TP is --use-torch-fsdp2; full recompute of every block.
  auto one = fsdp;
  one.layout.pipeline_parallel = 1;
  one.layout.schedule = PipelineSchedule::one_f_one_b;
  one.layout.virtual_stages = 1;
  one.layout.micro_batches = 2;  // 256 / 8 = 32 replicas x 2 x 1 = 64
  one.job.checkpointing = Checkpointing::full;
  const auto text = megatron_parallel_arguments(sc, one);
  CHECK(contains(text, "  --use-torch-fsdp2 \\\n  --no-gradient-accumulation-fusion \\\n"));
  CHECK(contains(text, "  --recompute-granularity full \\\n  --recompute-method uniform \\\n"
                       "  --recompute-num-layers 1\n"));
  CHECK(contains(text, "# ---- Megatron-LM core_v0.19.0"));
  // Per-op selective checkpointing has no Megatron-LM argument: said, never emitted without it
  // (the plan's peak assumes it; run without, the blocks keep everything).
  auto op = one;  // on one GPU's model: TP 1 (selective-op is not costed beside TP)
  op.layout.tensor_parallel = 1;
  op.layout.sequence_parallel = false;
  op.job.checkpointing = Checkpointing::selective_op;
  CHECK(megatron_arguments(sc, op).empty());
  CHECK(error_of([&] { megatron_parallel_arguments(sc, op); }) ==
        "--emit: Megatron-LM's selective recompute reruns whole modules (--recompute-modules, "
        "core_attn by default), not torchtitan's per-op save list (selective-op)");
}

TEST_CASE("parallel_emit::--emit megatron plans Megatron's recipe, which has no per-op save "
          "list") {
  // Megatron-LM's arguments run Megatron-core's GPT: the search plans its recipe (documents/
  // recipe.cpp, layout_emit), whose checkpointing has no torchtitan save list: exit 2 and the
  // reason, not arguments without recompute.
  using shardplan::planner::testing::planner;
  const auto r = planner({"recommend", "--model", "llama-2-7b", "--gpus", "8", "--model-parallel",
                          "--checkpointing", "selective-op", "--emit", "megatron"});
  CHECK(r.code == 2);
  CHECK_FALSE(contains(r.out, "pretrain_gpt.py"));
  CHECK(contains(r.err, "planner: --checkpointing: selective-op: recipe megatron does not run "
                        "torchtitan's per-op save list"));
}

TEST_CASE("parallel_emit::DeepSpeed runs a 1F1B pipeline with ZeRO-1 and says what it cannot") {
  const auto sc = llama70b(256, 512);
  LayoutCandidate c;
  c.layout.pipeline_parallel = 4;
  c.layout.micro_batches = 8;  // 256 / 4 = 64 replicas x 8 x 1 = 512
  c.job = sc.job;
  c.job.micro_batch = 1;
  c.job.checkpointing = Checkpointing::full;
  c.spec = make_spec("zero1", std::nullopt, 8);
  // train_batch_size = micro-batch x accumulation x data-parallel ranks: 1 x 8 x 64 = 512.
  const auto j = deepspeed_parallel_config(sc, c);
  CHECK(j["train_batch_size"] == 512);
  CHECK(j["train_micro_batch_size_per_gpu"] == 1);
  CHECK(j["gradient_accumulation_steps"] == 8);
  CHECK(j["zero_optimization"]["stage"] == 1);
  CHECK(j["pipeline"]["activation_checkpoint_interval"] == 1);
  CHECK(contains(deepspeed_pipeline_note(sc, c), "num_stages=4"));
  CHECK(contains(deepspeed_pipeline_note(sc, c), "holds 20 blocks"));
  const auto sc64 = llama70b(256, 64);
  CHECK(cannot_express(ParallelFramework::deepspeed, sc64,
                       interleaved(sc64, "zero1", Flavour::deepspeed)) ==
        "DeepSpeed's AutoTP (tensor_parallel.autotp_size) has no sequence parallelism over the "
        "norms and dropouts");
  CHECK(cannot_express(ParallelFramework::deepspeed, sc64, interleaved(sc64, "fsdp-full")) ==
        "this layout was costed with FSDP2 over the replicas; DeepSpeed's ZeRO-3 is another engine "
        "(and its pipeline engine refuses ZeRO-2 and ZeRO-3)");
  auto inter = c;
  inter.layout.schedule = PipelineSchedule::interleaved_1f1b;
  inter.layout.virtual_stages = 2;
  CHECK(cannot_express(ParallelFramework::deepspeed, sc, inter) ==
        "DeepSpeed's pipeline engine runs 1F1B only, not interleaved-1f1b");
  auto cp = c;
  cp.layout.context_parallel = 2;
  CHECK(contains(cannot_express(ParallelFramework::deepspeed, sc, cp), "Ulysses"));
}

TEST_CASE("parallel_emit::the plan document of a layout reads back with its parallel object") {
  const auto sc = llama70b(256, 64);
  const auto doc = layout_plan_document(sc, interleaved(sc, "fsdp-full"));
  CHECK(doc["parallel"]["tensor"] == 8);
  CHECK(doc["parallel"]["schedule"] == "interleaved-1f1b");
  CHECK(doc["parallel"]["virtual_stages"] == 5);
  const Plan back = plan_from_json(doc);
  CHECK(back.parallel.pipeline_parallel == 4);
  CHECK(back.prediction.peak_bytes > 0);
}

TEST_CASE("parallel_emit::recommend --model-parallel --emit on the command line") {
  using shardplan::planner::testing::planner;
  const std::vector<std::string> base = {
      "recommend",      "--model",        "llama-3-70b",  "--hardware",
      "h100-sxm5-80gb", "--gpus",         "256",          "--seq-len",
      "8192",           "--global-batch", "256",          "--recipe",
      "megatron",       "--loss",         "fp32-inplace", "--model-parallel",
      "--emit"};
  auto with = [&](std::vector<std::string> more) {
    auto a = base;
    a.insert(a.end(), more.begin(), more.end());
    return planner(a);
  };
  const auto plan = with({"plan"});
  REQUIRE(plan.code == 0);
  const auto doc = nlohmann::json::parse(plan.out);
  CHECK(doc.contains("parallel"));
  CHECK(plan_from_json(doc).parallel.model_parallel() > 1);
  // torchtitan's options run torchtitan's Llama, not the Megatron plan the search costed; under
  // torchtitan's recipe they are written.
  const auto other = with({"torchtitan"});
  CHECK(other.code == 2);
  CHECK(other.err == "planner: --emit: torchtitan: its options run torchtitan's Llama, but "
                     "--recipe megatron plans another code; give --recipe torchtitan or none\n");
  auto titan_args = base;
  titan_args[12] = "torchtitan";  // --recipe
  titan_args[14] = "upcast";      // --loss: torchtitan's
  titan_args.emplace_back("torchtitan");
  const auto titan = planner(titan_args);
  CHECK(titan.code == 0);
  CHECK(contains(titan.out, "-m torchtitan.train"));
  const auto megatron = with({"megatron"});
  CHECK(megatron.code == 0);
  CHECK(contains(megatron.out, "pretrain_gpt.py"));
  const auto fsdp = with({"fsdp"});
  CHECK(fsdp.code == 2);
  CHECK(fsdp.err == "planner: --emit: with --model-parallel must be torchtitan, megatron, "
                    "deepspeed or plan, got \"fsdp\" (torchtitan's options shard with FSDP2)\n");
  const auto dp = planner({"recommend", "--gpus", "8", "--emit", "torchtitan"});
  CHECK(dp.code == 2);
  CHECK(dp.err == "planner: --emit: torchtitan prints a layout of --model-parallel; give it, or "
                  "--emit fsdp for a data-parallel plan\n");
}
