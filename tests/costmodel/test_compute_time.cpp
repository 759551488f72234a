// The compute model by op kind (costmodel/compute_time.hpp): every expected time here is derived
// by hand from the profile's numbers and the formula's stated source, not read off the code.
#include <cmath>
#include <string>

#include <doctest/doctest.h>

#include "costmodel/compute_time.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/traffic.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

// A GPU of round numbers: 100 SMs, 1000 TFLOP/s bf16 at a 1 GHz boost, GEMMs at half of it,
// 2 TB/s of memory reached in full.
HardwareProfile round_gpu() {
  HardwareProfile p;
  p.name = "round";
  p.memory_bytes = 80e9;
  p.peak_flops = {{DType::fp32, 100e12}, {DType::bf16, 1000e12}};
  p.hbm_bandwidth_Bps = 2e12;
  p.compute_efficiency = 0.5;
  p.sm_count = 100;
  p.boost_clock_hz = 1e9;
  p.sustained_clock_hz = 1e9;
  p.gpus_per_node = 8;
  p.intra_bandwidth_Bps = 100e9;
  p.inter_bandwidth_Bps = 10e9;
  p.host_link_Bps = 10e9;
  p.host_optimizer_params_per_s = 1e9;
  return p;
}

TrainingJob bf16_job() {
  TrainingJob j;
  j.precision = Precision::bf16_mixed;
  j.seq_len = 1024;
  j.micro_batch = 1;
  j.global_batch = 8;
  return j;
}

}  // namespace

TEST_CASE("compute_time::a GEMM pays for whole tiles and whole waves") {
  const auto hw = round_gpu();
  const auto job = bf16_job();
  const ComputeModel cm(hw, job);
  // 1280 x 1280 x 4096: 10 x 10 = 100 tiles of 128 x 128, one full wave on 100 SMs.
  // 2·1280²·4096 FLOPs at 500 TFLOP/s.
  CHECK(cm.gemm_s({1280, 1280, 4096, 1}) == doctest::Approx(2.0 * 1280 * 1280 * 4096 / 500e12));
  // One more row: an 11th row of tiles (1408 rows) and 110 tiles, two waves of which the second
  // has 10: 2·1408·1280·4096 FLOPs run at 110/200 of the rate.
  CHECK(cm.gemm_s({1281, 1280, 4096, 1}) ==
        doctest::Approx(2.0 * 1408 * 1280 * 4096 / (500e12 * 110.0 / 200.0)));
  // A count multiplies.
  CHECK(cm.gemm_s({1280, 1280, 4096, 3}) == doctest::Approx(3 * cm.gemm_s({1280, 1280, 4096, 1})));
}

TEST_CASE("compute_time::a thin GEMM is bound by its bytes") {
  const auto hw = round_gpu();
  const auto job = bf16_job();
  const ComputeModel cm(hw, job);
  // 12800 x 1 x 12800 (a matrix-vector product): 100 tiles, one wave; 2·12800·128·12800 tile
  // FLOPs take 0.84 us at 500 TFLOP/s, while its operands (12800² + 12800 + 12800 elements of
  // 2 bytes) take 164 us at 2 TB/s.
  const double bytes = (12800.0 * 12800 + 12800 + 12800) * 2;
  CHECK(cm.gemm_s({12800, 1, 12800, 1}) == doctest::Approx(bytes / 2e12));
}

TEST_CASE("compute_time::a part held below its boost clock runs slower in proportion") {
  auto hw = round_gpu();
  const auto job = bf16_job();
  const double full = ComputeModel(hw, job).gemm_s({1280, 1280, 4096, 1});
  hw.sustained_clock_hz = 0.75e9;  // e.g. a lower power limit
  CHECK(ComputeModel(hw, job).gemm_s({1280, 1280, 4096, 1}) == doctest::Approx(full / 0.75));
}

TEST_CASE("compute_time::flash attention is matmul FLOPs and one exp per scored pair") {
  const auto hw = round_gpu();
  auto job = bf16_job();
  const ComputeModel cm(hw, job);
  // 8 heads x 1 sequence of 1600 tokens, head dim 128: 8 x 13 = 104 query tiles, two waves on 100
  // SMs (104/200 used). Pairs: 8·1600·1601/2. Exp rate: 100 SMs x 16 per clock x 1 GHz.
  const AttentionShape a{1, 1600, 8, 8, 128};
  const double pairs = 8.0 * 1600 * 1601 / 2;
  CHECK(a.scored_pairs() == pairs);
  const double wave = 104.0 / 200.0;
  CHECK(cm.attention_forward_s(a) ==
        doctest::Approx(pairs * (4 * 128 / 500e12 + 1 / 1.6e12) / wave));
  CHECK(cm.attention_backward_s(a) ==
        doctest::Approx(pairs * (10 * 128 / 500e12 + 1 / 1.6e12) / wave));
  // A narrower head spends a larger share on the exp: per pair 4·64/500e12 = 0.51 ps of matmul
  // against 0.625 ps of exp.
  const AttentionShape narrow{1, 1600, 8, 8, 64};
  CHECK(cm.attention_forward_s(narrow) / cm.attention_forward_s(a) ==
        doctest::Approx((4 * 64 / 500e12 + 1 / 1.6e12) / (4 * 128 / 500e12 + 1 / 1.6e12)));
}

TEST_CASE("compute_time::eager attention is batched GEMMs and passes over the scores") {
  const auto hw = round_gpu();
  auto job = bf16_job();
  job.attention = AttentionImpl::eager;
  const ComputeModel cm(hw, job);
  const AttentionShape a{2, 1024, 4, 4, 128};
  // QKᵀ (1024 x 1024 x 128) and P·V (1024 x 128 x 1024), 8 of each; 4 passes over 8·1024² scores
  // of 2 bytes.
  const double fwd = cm.gemm_s({1024, 1024, 128, 8}) + cm.gemm_s({1024, 128, 1024, 8}) +
                     4 * 8 * 1024.0 * 1024 * 2 / 2e12;
  CHECK(cm.attention_forward_s(a) == doctest::Approx(fwd));
  const double bwd = 3 * cm.gemm_s({1024, 128, 1024, 8}) + cm.gemm_s({1024, 1024, 128, 8}) +
                     3 * 8 * 1024.0 * 1024 * 2 / 2e12;
  CHECK(cm.attention_backward_s(a) == doctest::Approx(bwd));
}

TEST_CASE("compute_time::calibrated times are used for their shapes and scaled to others") {
  auto hw = round_gpu();
  Calibration c;
  c.backend = "mpi";
  c.ranks = 1;
  c.gemm.push_back({256, 384, 128, DType::bf16, 1e-3});
  c.attention.push_back({"flash", DType::bf16, 2, 512, 4, 2, 64, 2e-3, 5e-3});
  hw.calibration = c;
  const auto job = bf16_job();
  const ComputeModel cm(hw, job);
  CHECK(cm.gemm_s({256, 384, 128, 2}) == doctest::Approx(2e-3));
  // Twice the tokens (m), the same weight: twice the time.
  CHECK(cm.gemm_s({512, 384, 128, 1}) == doctest::Approx(2e-3));
  // Its weight gradient with twice the tokens (k): twice the time.
  CHECK(cm.gemm_s({256, 384, 256, 1}) == doctest::Approx(2e-3));
  // Twice the sequences: twice the time; twice the sequence: pairs 1024·1025 against 512·513.
  CHECK(cm.attention_forward_s({4, 512, 4, 2, 64}) == doctest::Approx(4e-3));
  CHECK(cm.attention_backward_s({2, 1024, 4, 2, 64}) ==
        doctest::Approx(5e-3 * 1024 * 1025 / (512.0 * 513)));
}

TEST_CASE(
    "compute_time::a CPU's fp32 GEMMs and attention cores serve its fp32 jobs, a GPU's do not") {
  auto hw = round_gpu();
  Calibration c;
  c.backend = "mpi";
  c.ranks = 1;
  c.gemm.push_back({256, 384, 128, DType::fp32, 1e-3});
  c.attention.push_back({"eager", DType::fp32, 2, 128, 4, 2, 32, 600e-6, 1100e-6});
  hw.calibration = c;
  TrainingJob job = bf16_job();
  job.precision = Precision::fp32;  // computes in tf32 (a GPU's TF32 GEMMs)
  job.attention = AttentionImpl::eager;
  const AttentionShape a{2, 128, 4, 2, 32};
  // On a GPU an fp32 core is not the TF32 one: the eager formula stands.
  const ComputeModel gpu(hw, job);
  CHECK(gpu.attention_forward_s(a) != doctest::Approx(600e-6));
  // A CPU has no TF32: its fp32 job runs the fp32 kernels calibrate timed.
  hw.is_cpu = true;
  const ComputeModel cpu(hw, job);
  CHECK(cpu.attention_forward_s(a) == doctest::Approx(600e-6));
  CHECK(cpu.attention_backward_s(a) == doctest::Approx(1100e-6));
  CHECK(cpu.gemm_s({256, 384, 128, 1}) == doctest::Approx(1e-3));
  CHECK(gpu.gemm_s({256, 384, 128, 1}) != doctest::Approx(1e-3));
  // A bf16 job matches bf16 cores only.
  TrainingJob bf16 = bf16_job();
  bf16.attention = AttentionImpl::eager;
  const ComputeModel cpu_bf16(hw, bf16);
  CHECK(cpu_bf16.attention_forward_s(a) != doctest::Approx(600e-6));
}

TEST_CASE("compute_time::the host's work hides behind a GPU's kernels, adds to a CPU's") {
  auto hw = round_gpu();
  hw.op_dispatch_s = 10e-6;
  hw.framework["fsdp2"] = {100e-6, 200e-6, 1e-6, 2e-6, 0, 0};
  hw.framework["deepspeed_zero3"] = {100e-6, 200e-6, 1e-6, 2e-6, 30e-6, 40e-6};
  UnitWork w;
  w.forward_kernels = 20;
  w.backward_kernels = 30;
  // A unit of 9 parameter tensors, 7 of them linear layers' weights.
  UnitTensors unit;
  for (int i = 0; i < 9; ++i)
    unit.tensors.push_back(i < 7 ? Tensor{"w" + std::to_string(i), 4, 4}
                                 : Tensor{"b" + std::to_string(i), 4, 1});
  REQUIRE(unit.matrices() == 7);
  // 20 launches of 10 us + 100 us + 9 tensors x 1 us; 30 x 10 + 200 + 9 x 2.
  const auto h = unit_host_work(hw, "fsdp2", w, unit);
  CHECK(h.forward_s == doctest::Approx(309e-6));
  CHECK(h.backward_s == doctest::Approx(518e-6));
  CHECK(unit_host_work(hw, "ddp", w, unit).forward_s == doctest::Approx(200e-6));
  // DeepSpeed's hooks on each of the 7 linear submodules: + 7 x 30 us, + 7 x 40 us.
  CHECK(unit_host_work(hw, "deepspeed_zero3", w, unit).forward_s == doctest::Approx(519e-6));
  CHECK(unit_host_work(hw, "deepspeed_zero3", w, unit).backward_s == doctest::Approx(798e-6));

  // In a step: GPT-2 on one GPU, DDP; a per-unit hook far longer than any unit's kernels makes
  // each unit's forward and backward take the host's time, and the excess is host overhead.
  const auto m = load_model("gpt2");
  hw.framework["ddp"] = {1.0, 2.0, 0, 0, 0, 0};  // seconds: nothing on the device takes as long
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {1, 1};
  in.job = bf16_job();
  in.job.global_batch = 1;
  in.spec = make_spec("ddp", std::nullopt, 1);
  const auto r = simulate_step(in);
  const double units = 12 + 2;
  const double device = r.compute_by_kind_s[static_cast<int>(ComputeKind::gemm)] +
                        r.compute_by_kind_s[static_cast<int>(ComputeKind::attention)] +
                        r.compute_by_kind_s[static_cast<int>(ComputeKind::memory_bound)];
  const double host = units * 3.0 + [&] {
    double launches = 0;
    for (auto u : {UnitKind::embedding, UnitKind::head}) {
      const auto uw = unit_work(ComputeModel(hw, in.job), m, in.job, u, Forward{2, 4, true});
      launches += uw.forward_kernels + uw.backward_kernels;
    }
    const auto bw =
        unit_work(ComputeModel(hw, in.job), m, in.job, UnitKind::block, Forward{2, 4, true});
    return (launches + 12 * (bw.forward_kernels + bw.backward_kernels)) * 10e-6;
  }();
  CHECK(r.compute_by_kind_s[static_cast<int>(ComputeKind::host_overhead)] ==
        doctest::Approx(host - device));
  // A CPU rank does both in turn.
  hw.is_cpu = true;
  const auto cpu = simulate_step(in);
  CHECK(cpu.compute_by_kind_s[static_cast<int>(ComputeKind::host_overhead)] ==
        doctest::Approx(host));
}

TEST_CASE("compute_time::the kinds add up to the compute stream's busy time") {
  // Llama-2-7b, FSDP2, full checkpointing: compute_s = Σ kinds; recompute = one block forward
  // per block per micro-batch.
  const auto m = load_model("llama-2-7b");
  const auto hw = load_hardware("h100-sxm5-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job = bf16_job();
  in.job.seq_len = 4096;
  in.job.global_batch = 16;
  in.job.checkpointing = Checkpointing::full;
  in.spec = make_spec("fsdp-full", Flavour::fsdp2, 8);
  const auto r = simulate_step(in);
  double sum = 0;
  for (double x : r.compute_by_kind_s) sum += x;
  CHECK(sum == doctest::Approx(r.compute_s));
  const ComputeModel cm(hw, in.job);
  const Forward f{2, 2, true};
  const auto block = unit_work(cm, m, in.job, UnitKind::block, f);
  // The rerun stops early: transformers' checkpoint does not redo the block's last residual add.
  const double skipped =
      cm.traffic_s(block_traffic(m, in.job, f).forward - recompute_traffic(m, in.job, f).forward);
  CHECK(skipped > 0);
  CHECK(r.compute_by_kind_s[static_cast<int>(ComputeKind::recompute)] ==
        doctest::Approx(2 * 32 * (block.forward_s() - skipped)));  // 2 micro-batches of 1 sequence
}

TEST_CASE("compute_time::the host optimizer runs at its framework's rate") {
  // DeepSpeed steps offloaded states with its CPUAdam, FSDP's CPUOffload with torch.optim.AdamW on
  // CPU tensors: a profile that gives both rates times each flavour with its own.
  const auto m = load_model("llama-2-7b");
  auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job = bf16_job();
  in.job.global_batch = 8;
  auto host_s = [&](const char* strategy, Flavour f) {
    in.spec = make_spec(strategy, f, 8);
    // FSDP's CPUOffload moves the parameters too; DeepSpeed's offload_optimizer alone.
    in.spec.offload = f == Flavour::deepspeed ? Offload::optimizer : Offload::params;
    const auto r = simulate_step(in);
    REQUIRE(r.valid);
    return r.exposed_s[static_cast<int>(Stream::host)];
  };
  hw.host_optimizer_by_framework = {{"deepspeed", 2e9}, {"torch", 0.5e9}};
  const double ds_fast = host_s("zero3", Flavour::deepspeed),
               fsdp_slow = host_s("fsdp-full", Flavour::fsdp2);
  hw.host_optimizer_by_framework = {{"deepspeed", 0.5e9}, {"torch", 2e9}};
  const double ds_slow = host_s("zero3", Flavour::deepspeed),
               fsdp_fast = host_s("fsdp-full", Flavour::fsdp2);
  CHECK(ds_fast < ds_slow);
  CHECK(fsdp_fast < fsdp_slow);
  // One rate for both (a profile without the split) is that rate for either.
  hw.host_optimizer_by_framework.clear();
  hw.host_optimizer_params_per_s = 0.5e9;
  CHECK(host_s("zero3", Flavour::deepspeed) == doctest::Approx(ds_slow));
}

TEST_CASE("compute_time::a measured rate times exactly its passes") {
  // The layers that are not GEMMs (documents/workload.hpp) on a profile that measured their rate.
  // One rank, DDP, one micro-batch of 2 x 128 tokens of the executor's model: the compute stream's
  // memory-bound time is every unit's passes (forward and backward) x tokens / rate, by the
  // definition of the rate (calibrate times the executor's kernels).
  const auto m = load_model("gpt2");
  auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {1, 1};
  in.job.seq_len = 128;
  in.job.global_batch = 2;
  in.job.micro_batch = 2;
  in.job.recipe = Recipe::executor;
  in.spec = make_spec("ddp", std::nullopt, 1);
  Calibration c;
  c.backend = "mpi";
  c.ranks = 1;
  const double rate = 1e9;  // passes per second
  c.elementwise_elems_per_s = rate;
  hw.calibration = c;
  double passes = 0;
  for (const auto& ops : {embedding_elementwise_ops(m), head_elementwise_ops(m)}) {
    const Passes p = passes_per_token(ops);
    passes += p.forward + p.backward;
  }
  const Passes b = passes_per_token(block_elementwise_ops(m));
  passes += 12 * (b.forward + b.backward);
  const auto r = simulate_step(in);
  CHECK(r.compute_by_kind_s[static_cast<int>(ComputeKind::memory_bound)] ==
        doctest::Approx(256 * passes / rate).epsilon(1e-9));
}

// Each unit's memory-bound ops split over a tensor-parallel group by where they run
// (traffic.hpp, OpSpread), one rule for every recipe's rows. GPT-2 under the executor's kernels
// (documents/workload.hpp, passes_of): per token its block's forward passes are two LayerNorms and
// two residual adds of 2 passes over h = 768 (6,144 elements, the residual stream) and GELU's 2
// over I = 3,072 (6,144, the heads' width). With t = 4 and no sequence parallelism a rank runs the
// residual stream whole and a quarter of the rest: 6,144 + 1,536 = 7,680 elements per token;
// with sequence parallelism a quarter of both, 3,072. At a calibrated 1e9 passes per second and
// 1,024 tokens: 7.86432 ms and 3.145728 ms. transformers' head (Llama-2-7B) under its tp_plan
// computes the loss on logits gathered whole (lm_head "colwise_rep"): with sequence parallelism
// only the final norm splits; Megatron-core's vocabulary-parallel loss splits the loss's share.
TEST_CASE("compute_time::tensor parallelism splits each element-wise op where it runs") {
  auto hw = round_gpu();
  Calibration c;
  c.backend = "mpi";
  c.ranks = 1;
  c.elementwise_elems_per_s = 1e9;
  hw.calibration = c;
  TrainingJob j = bf16_job();
  j.recipe = Recipe::executor;
  const auto gpt2 = load_model("gpt2");
  const Forward f{2, 4, true};
  const auto memory = static_cast<int>(ComputeKind::memory_bound);
  const ComputeModel cm(hw, j);
  CHECK(unit_work(cm, gpt2, j, UnitKind::block, f, 1, {4, false, true}).forward[memory] ==
        doctest::Approx(7.86432e-3).epsilon(1e-12));
  CHECK(unit_work(cm, gpt2, j, UnitKind::block, f, 1, {4, true, true}).forward[memory] ==
        doctest::Approx(3.145728e-3).epsilon(1e-12));

  j.recipe = Recipe::hf;
  const auto llama = load_model("llama-2-7b");
  const ComputeModel hf(hw, j);
  const Traffic head = head_traffic(llama, j, f);
  const Traffic norm = unit_traffic(llama, j, f, UnitKind::head, OpSpread::residual);
  REQUIRE(norm.forward > 0);
  REQUIRE(norm.forward < head.forward);
  CHECK(unit_work(hf, llama, j, UnitKind::head, f, 1, {4, true, false}).forward[memory] ==
        doctest::Approx(hf.traffic_s(norm.forward / 4 + (head.forward - norm.forward))));
  CHECK(unit_work(hf, llama, j, UnitKind::head, f, 1, {4, false, true}).forward[memory] ==
        doctest::Approx(hf.traffic_s(norm.forward + (head.forward - norm.forward) / 4)));
}
