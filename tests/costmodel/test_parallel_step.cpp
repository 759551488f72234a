#include <doctest/doctest.h>

#include <algorithm>

#include "costmodel/parallel_step.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

struct Setup {
  ModelSpec model = load_model("llama-3-70b");
  HardwareProfile hw = load_hardware("h100-sxm5-80gb");
  StepInput in;
  Setup(int gpus, std::int64_t global, std::int64_t micro, const std::string& strategy) {
    in.model = &model;
    in.hardware = &hw;
    in.cluster = {gpus, 8};
    in.job.seq_len = 8192;
    in.job.global_batch = global;
    in.job.micro_batch = micro;
    in.job.recipe = Recipe::megatron;
    in.job.loss = LossImpl::fp32_inplace;
    in.spec = make_spec(strategy, std::nullopt, 8);
  }
};

ParallelLayout layout(int t, bool sp, int p, int m, int c = 1) {
  ParallelLayout l;
  l.tensor_parallel = t;
  l.sequence_parallel = sp;
  l.pipeline_parallel = p;
  l.micro_batches = m;
  l.context_parallel = c;
  return l;
}

}  // namespace

TEST_CASE("parallel_step::t = p = c = 1 is the step simulator's result") {
  Setup s(64, 64, 1, "fsdp-full");
  const auto plain = simulate_step(s.in);
  const auto same = simulate_parallel_step(s.in, ParallelLayout{}).step;
  CHECK(same.step_s == plain.step_s);
  CHECK(same.peak_bytes == plain.peak_bytes);
  CHECK(same.peak_when == plain.peak_when);
  CHECK(same.comm_bytes_per_gpu == plain.comm_bytes_per_gpu);
}

// What a stage sends the next per micro-batch, GPT-3 shapes, s = 2048, b = 1, e = 2: the
// activations 2·2048·12288 = 50,331,648 bytes, or under sequence parallelism (Megatron sends the
// sequence-parallel shard) 1/8 of them. (Tensor parallelism's and the ring's bytes are the walk's:
// test_tensor_parallel_walk.cpp, tests/planner/test_context_parallel.cpp.)
TEST_CASE("parallel_step::the activations between stages, hand-derived") {
  const nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
                                 {"n_embd", 12288},
                                 {"n_head", 96},
                                 {"n_layer", 96},
                                 {"n_positions", 2048},
                                 {"vocab_size", 51200}};
  const auto gpt3 = model_from_hf_config(config, "gpt3");
  TrainingJob j;
  j.seq_len = 2048;
  j.micro_batch = 1;
  // Between stages: the s·b·h activations, 50,331,648 bytes; the sequence-parallel shard: 1/8.
  CHECK(p2p_bytes(gpt3, j, layout(8, false, 2, 2), 2) == doctest::Approx(50331648.0));
  CHECK(p2p_bytes(gpt3, j, layout(8, true, 2, 2), 2) == doctest::Approx(6291456.0));
}

TEST_CASE("parallel_step::Llama-3-70B on 256 GPUs with TP 8 and PP 4") {
  Setup s(256, 64, 1, "fsdp-full");
  const auto l = layout(8, true, 4, 8);  // d = 8, 8 micro-batches of 1
  const auto r = simulate_parallel_step(s.in, l);
  REQUIRE(r.step.valid);
  // The walk's bubble with nearly equal stages: (p − 1)/m = 3/8 of a stage's work for equal ones.
  // The last stage also runs the head and is the busiest: the others' idle time, measured
  // against its longer work, is a little under 3/8.
  CHECK(r.walk.bubble_fraction <= doctest::Approx(3.0 / 8));
  CHECK(r.walk.bubble_fraction > 0.3);
  CHECK(r.memory.peak_stage == 0);
  CHECK(contains(r.step.peak_when, "stage 0 of 4"));
  CHECK(r.step.peak_bytes < s.hw.memory_bytes);
  // Stages 1 and 2 hold only blocks and run the same ops: equal forward times.
  CHECK(r.stage_forward_s[1] == doctest::Approx(r.stage_forward_s[2]));
  CHECK(r.stage_forward_s[3] > r.stage_forward_s[2]);  // the head
  // Neighbouring stages are 64 ranks apart: the send crosses nodes, one inter-node hop:
  // latency + (2·8192·8192/8 bytes) / the NIC bandwidth per GPU.
  CHECK(r.p2p_s == doctest::Approx(s.hw.inter_latency_s + 16777216.0 / s.hw.inter_bandwidth_Bps));
  // TP's collectives are all exposed without async TP, and fewer with it.
  CHECK(r.tp_exposed_s > 0);
  ParallelLayout async = l;
  async.async_tensor_parallel = true;
  CHECK(simulate_parallel_step(s.in, async).tp_exposed_s < r.tp_exposed_s);
  // Step = compute + bubble + exposed communication.
  CHECK(r.step.step_s == doctest::Approx(r.step.compute_s + r.bubble_s + r.step.exposed_comm_s));
  CHECK(r.step.mfu > 0.1);
  CHECK(r.step.mfu < 1.0);
}

TEST_CASE("parallel_step::more micro-batches shrink the bubble, impossible layouts say why") {
  Setup s(256, 128, 1, "fsdp-full");
  const auto m16 = simulate_parallel_step(s.in, layout(8, true, 4, 16));
  Setup s8(256, 64, 1, "fsdp-full");
  const auto m8 = simulate_parallel_step(s8.in, layout(8, true, 4, 8));
  CHECK(m16.walk.bubble_fraction < m8.walk.bubble_fraction);
  const auto bad = simulate_parallel_step(s.in, layout(16, true, 4, 16)).step;
  CHECK_FALSE(bad.valid);
  CHECK(contains(bad.reason, "tensor parallel 16 is larger than a node of 8 GPUs"));
  ParallelLayout wrong_batch = layout(8, true, 4, 8);  // 8 replicas x 8 x 1 = 64, not 128
  CHECK(
      contains(simulate_parallel_step(s.in, wrong_batch).step.reason, "not the global batch 128"));
}

// Tied embeddings under a pipeline (Megatron-core,
// megatron/core/distributed/finalize_model_grads.py, _allreduce_word_embedding_grads): the first
// and the last stage all-reduce the word-embedding gradient after the data-parallel reduction.
// GPT-2 (124M, tied): 50257 x 768 = 38,597,376 elements, reduced in fp32: 154,389,504 bytes. A ring
// all-reduce of 2 ranks sends 2·(2−1)/2 = 1 buffer per rank. On 16 GPUs of 8 with pipeline 2 and
// data parallel 8 the two stages' ranks are t·c·d = 8 apart, on different nodes, one rank of the
// pair per node: 2 inter-node hops of latency plus the bytes at one NIC's bandwidth (capped by the
// node's links).
TEST_CASE("parallel_step::tied embeddings: the first and last stage all-reduce the gradient") {
  ModelSpec gpt2 = load_model("gpt2");
  REQUIRE(gpt2.tied_embeddings);
  Setup s(16, 64, 1, "ddp");
  s.in.model = &gpt2;
  s.in.job.seq_len = 1024;
  s.in.spec.reduce_dtype = DType::fp32;
  const auto r = simulate_parallel_step(s.in, layout(1, false, 2, 8));
  REQUIRE(r.step.valid);
  CHECK(r.embedding_bytes == doctest::Approx(154'389'504.0));
  const auto& hw = s.hw;
  const double expected = 2 * hw.inter_latency_s +
                          154'389'504.0 / std::min(hw.intra_bandwidth_Bps, hw.inter_bandwidth_Bps);
  CHECK(r.embedding_allreduce_s == doctest::Approx(expected));
  // Exposed after the data-parallel reduction on both stages (nothing runs beside it).
  CHECK(r.dp_exposed_s >= r.embedding_allreduce_s);
  // One stage holds both ends: nothing to all-reduce. Llama 3 does not tie: nothing either.
  Setup one(16, 64, 1, "ddp");
  one.in.model = &gpt2;
  one.in.job.seq_len = 1024;
  one.in.job.micro_batch = 2;  // tensor 2: 8 replicas x 4 x 2 = 64
  CHECK(simulate_parallel_step(one.in, layout(2, true, 1, 4)).embedding_allreduce_s == 0);
  Setup llama(256, 64, 1, "ddp");
  const auto untied = simulate_parallel_step(llama.in, layout(8, true, 4, 8));
  REQUIRE(untied.step.valid);
  CHECK(untied.embedding_allreduce_s == 0);
}

TEST_CASE(
    "parallel_step::torchtitan's interleaved pipeline is timed in the order its memory walks") {
  // torch.distributed.pipelining's Interleaved1F1B orders a stage's chunks otherwise than
  // Megatron-LM with m = p (torch_interleaved_ops): Megatron runs all m·v = 8 forwards of stage 0
  // before its first backward, torch fewer. The step is one walk of the recipe's order
  // (stage_orders): the chunks it holds at once are torch's, and its time follows the same ops.
  Setup s(128, 16, 1, "ddp");  // d = 128 / 32 = 4: 4 x 4 micro-batches x 1 = 16 sequences
  s.in.job.recipe = Recipe::torchtitan;
  s.in.job.checkpointing = Checkpointing::full;
  ParallelLayout l = layout(8, true, 4, 4);
  l.schedule = PipelineSchedule::interleaved_1f1b;
  l.virtual_stages = 2;
  const auto r = simulate_parallel_step(s.in, l);
  REQUIRE(r.step.valid);
  ParallelMemoryInput mi{s.in.model, s.in.hardware, s.in.cluster, s.in.job, s.in.spec, l};
  const auto torch = stage_orders(mi);
  const auto megatron = schedule_ops(l.schedule, 4, 2, 4);
  CHECK(peak_chunks(megatron).front() == 8);
  CHECK(peak_chunks(torch) != peak_chunks(megatron));
  CHECK(r.walk.peak_chunks == peak_chunks(torch));
  // Every stage is busy for its own ops only; the step waits for the last stage to end.
  for (std::size_t st = 0; st < 4; ++st) CHECK(r.walk.busy_s[st] < r.walk.end_s[st]);
  CHECK(r.walk.span_s == *std::max_element(r.walk.end_s.begin(), r.walk.end_s.end()));
}

// A stage runs the step walk's units (compute_time.hpp's GEMMs by shape, attention, memory-bound
// ops and the host's dispatch): split over two pipeline stages without tensor parallelism, the
// stages' forward and backward per micro-batch add up to the walk's for the whole model (stage 0
// the embeddings and 40 blocks, stage 1 40 blocks and the head). Tensor parallelism splits the
// GEMMs and the heads but each rank launches every kernel and, without sequence parallelism,
// keeps the residual width's element-wise ops whole: t = 2 takes more than half of t = 1's
// compute, and sequence parallelism (which splits those ops along the sequence) less than t = 2
// without it.
TEST_CASE("parallel_step::the stages run the step walk's units, split over the tensor ranks") {
  Setup s(16, 16, 1, "ddp");  // d = 8 replicas x 2 micro-batches of 1
  const auto whole = simulate_step(s.in);
  const auto piped = simulate_parallel_step(s.in, layout(1, false, 2, 2));
  REQUIRE(whole.valid);
  REQUIRE(piped.step.valid);
  CHECK(piped.stage_forward_s[0] + piped.stage_forward_s[1] ==
        doctest::Approx(whole.forward_per_mb_s).epsilon(1e-9));
  CHECK(piped.stage_backward_s[0] + piped.stage_backward_s[1] ==
        doctest::Approx(whole.backward_per_mb_s).epsilon(1e-9));
  // The step's compute by kind (GEMMs, attention, memory-bound, host, optimizer) sums to it.
  double by_kind = 0;
  for (const double k : piped.step.compute_by_kind_s) by_kind += k;
  CHECK(by_kind == doctest::Approx(piped.step.compute_s).epsilon(1e-12));
  CHECK(piped.step.compute_by_kind_s[static_cast<int>(ComputeKind::gemm)] > 0);

  const double one = whole.forward_per_mb_s + whole.backward_per_mb_s;
  Setup tp(16, 8, 1, "ddp");  // 8 replicas of t = 2, one micro-batch of 1 each
  const double two = simulate_parallel_step(tp.in, layout(2, false, 1, 1)).compute_per_mb_s;
  const double two_sp = simulate_parallel_step(tp.in, layout(2, true, 1, 1)).compute_per_mb_s;
  CHECK(two < one);
  CHECK(two > one / 2);
  CHECK(two_sp < two);
}
