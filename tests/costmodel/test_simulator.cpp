// The step simulator against independent numbers (ZeRO paper Figure 1 and Table 1, Korthikanti
// et al. Table 2, Narayanan et al. FLOPs) and the properties any correct cost model must have.
#include <doctest/doctest.h>

#include <cmath>

#include "costmodel/accounting.hpp"
#include "costmodel/simulator.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

StepResult run(const ModelSpec& m, const HardwareProfile& hw, int gpus, const std::string& strategy,
               Accounting acc = Accounting::framework, std::int64_t global_batch = 0,
               std::int64_t micro_batch = 1, std::int64_t seq = 2048) {
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {gpus, std::min(gpus, hw.gpus_per_node)};
  in.job.seq_len = seq;
  in.job.global_batch = global_batch > 0 ? global_batch : gpus;
  in.job.micro_batch = micro_batch;
  in.spec = make_spec(strategy, std::nullopt, in.cluster.gpus_per_node);
  in.accounting = acc;
  return simulate_step(in);
}

double states_GB(const StepResult& r) { return total(r.model_states) / 1e9; }

}  // namespace

TEST_CASE("simulator::zero paper figure 1") {
  // Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N_d = 64, K = 12: model states per GPU of
  // 120 GB (baseline), 31.4 GB (P_os), 16.6 GB (P_os+g), 1.9 GB (P_os+g+p).
  const auto m = model_from_param_count(7.5e9);
  const auto hw = load_hardware("a100-sxm4-80gb");
  CHECK(states_GB(run(m, hw, 64, "ddp", Accounting::zero_paper)) == doctest::Approx(120.0));
  CHECK(states_GB(run(m, hw, 64, "zero1", Accounting::zero_paper)) ==
        doctest::Approx(31.4).epsilon(0.002));
  CHECK(states_GB(run(m, hw, 64, "zero2", Accounting::zero_paper)) ==
        doctest::Approx(16.6).epsilon(0.003));
  CHECK(states_GB(run(m, hw, 64, "zero3", Accounting::zero_paper)) ==
        doctest::Approx(1.9).epsilon(0.02));
}

TEST_CASE("simulator::zero paper table 1") {
  // Rajbhandari et al. 2020, Table 1: per-device model-state memory (GB) for P_os, P_os+g,
  // P_os+g+p at DP degrees 1..1024, models of 7.5B, 128B and 1T parameters.
  struct Row {
    double params;
    int dp;
    double os, osg, osgp;
  };
  const Row rows[] = {
      {7.5e9, 1, 120, 120, 120},      {7.5e9, 4, 52.5, 41.3, 30},
      {7.5e9, 16, 35.6, 21.6, 7.5},   {7.5e9, 64, 31.4, 16.6, 1.88},
      {7.5e9, 256, 30.4, 15.4, 0.47}, {7.5e9, 1024, 30.1, 15.1, 0.12},
      {128e9, 1, 2048, 2048, 2048},   {128e9, 4, 896, 704, 512},
      {128e9, 16, 608, 368, 128},     {128e9, 64, 536, 284, 32},
      {128e9, 256, 518, 263, 8},      {128e9, 1024, 513, 257, 2},
      {1e12, 1, 16000, 16000, 16000}, {1e12, 4, 7000, 5500, 4000},
      {1e12, 16, 4750, 2875, 1000},   {1e12, 64, 4187, 2218, 250},
      {1e12, 256, 4046, 2054, 62.5},  {1e12, 1024, 4011, 2013, 15.6},
  };
  const auto hw = load_hardware("a100-sxm4-80gb");
  for (const auto& row : rows) {
    CAPTURE(row.params);
    CAPTURE(row.dp);
    const auto m = model_from_param_count(row.params);
    // The table prints 3 significant digits: compare within half a unit of the last digit.
    auto near = [](double got, double want) {
      return std::fabs(got - want) <= 0.006 * want + 0.005;
    };
    CHECK(near(states_GB(run(m, hw, row.dp, "zero1", Accounting::zero_paper)), row.os));
    CHECK(near(states_GB(run(m, hw, row.dp, "zero2", Accounting::zero_paper)), row.osg));
    CHECK(near(states_GB(run(m, hw, row.dp, "zero3", Accounting::zero_paper)), row.osgp));
  }
}

TEST_CASE("simulator::communication volume per step") {
  // ZeRO §7: DDP all-reduce moves 2Ψ per GPU, ZeRO-1/2 reduce-scatter + all-gather 2Ψ, ZeRO-3
  // two all-gathers and a reduce-scatter 3Ψ (elements; fp16 = 2 bytes), ring factor (n−1)/n aside.
  const auto m = model_from_param_count(7.5e9);
  const auto hw = load_hardware("a100-sxm4-80gb");
  const int n = 64;
  const double psi_bytes = 2 * 7.5e9 * (n - 1) / n;
  auto volume = [&](const char* s) {
    return run(m, hw, n, s, Accounting::zero_paper).comm_bytes_per_gpu / psi_bytes;
  };
  CHECK(volume("ddp") == doctest::Approx(2.0));
  CHECK(volume("zero1") == doctest::Approx(2.0));
  CHECK(volume("zero2") == doctest::Approx(2.0));
  CHECK(volume("zero3") == doctest::Approx(3.0));
}

TEST_CASE("simulator::gradient accumulation follows the frameworks") {
  // DDP/ZeRO-1 skip the reduction on non-final micro-batches (no_sync); ZeRO-2 reduces each one.
  const auto m = model_from_param_count(1e9);
  const auto hw = load_hardware("a100-sxm4-80gb");
  const auto ddp1 = run(m, hw, 8, "ddp", Accounting::zero_paper, 8);
  const auto ddp4 = run(m, hw, 8, "ddp", Accounting::zero_paper, 32);
  CHECK(ddp4.grad_accumulation == 4);
  CHECK(ddp4.comm_bytes_per_gpu == doctest::Approx(ddp1.comm_bytes_per_gpu));
  const auto z1 = run(m, hw, 8, "zero2", Accounting::zero_paper, 8);
  const auto z4 = run(m, hw, 8, "zero2", Accounting::zero_paper, 32);
  // 4 reduce-scatters of Ψ and one all-gather of Ψ instead of one each: 5/2 of the volume.
  CHECK(z4.comm_bytes_per_gpu == doctest::Approx(z1.comm_bytes_per_gpu * 5.0 / 2.0));
  // Forward and backward run 4 times; the optimizer step once.
  CHECK(z4.compute_s - z4.optimizer_s == doctest::Approx(4 * (z1.compute_s - z1.optimizer_s)));
  CHECK(z4.optimizer_s == doctest::Approx(z1.optimizer_s));
  CHECK(z4.step_s > z1.step_s);
}

TEST_CASE("simulator::korthikanti activation table") {
  // Korthikanti et al. 2022, Table 2, no parallelism: per layer s·b·h·(34 + 5·a·s/h) bytes;
  // selective recompute 34·s·b·h; full recompute 2·s·b·h. GPT-2's block has their shapes (4h GELU
  // MLP, dropout, multi-head attention, LayerNorm); the table counts Megatron's GPT.
  const auto m = load_model("gpt2-xl");
  const double s = 1024, b = 4, h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads);
  TrainingJob j;
  j.recipe = Recipe::megatron;
  j.seq_len = 1024;
  j.micro_batch = 4;
  j.attention = AttentionImpl::eager;
  const auto none = block_activations(m, j, {2.0, 2.0, true}, false);
  CHECK(none.saved == doctest::Approx(s * b * h * (34 + 5 * a * s / h)));
  j.checkpointing = Checkpointing::selective_attention;
  const auto sel = block_activations(m, j, {2.0, 2.0, true}, false);
  CHECK(sel.saved == doctest::Approx(34 * s * b * h));
  j.checkpointing = Checkpointing::full;
  const auto full = block_activations(m, j, {2.0, 2.0, true}, true);
  CHECK(full.saved == doctest::Approx(2 * s * b * h));
  CHECK(full.recompute == doctest::Approx(none.saved));
  // Flash attention drops the s×s terms, keeping an fp32 logsumexp per head and token.
  j.checkpointing = Checkpointing::none;
  j.attention = AttentionImpl::flash;
  const auto flash = block_activations(m, j, {2.0, 2.0, true}, false);
  CHECK(flash.saved == doctest::Approx(34 * s * b * h + 4 * a * s * b));
}

TEST_CASE("simulator::narayanan flops per layer") {
  // Narayanan et al. 2021 §5.1: forward FLOPs of a GPT layer are 24·B·s·h² + 4·B·s²·h.
  const auto m = load_model("gpt2-xl");
  const double s = 1024, h = static_cast<double>(m.hidden);
  const double per_token = block_forward_flops_per_token(m, 1024);
  // GPT-2's block also has biases and LayerNorms, which are not GEMM weights.
  CHECK(per_token == doctest::Approx((24 * s * h * h + 4 * s * s * h) / s));
}

TEST_CASE("simulator::model states ordered ddp >= zero1 >= zero2 >= zero3") {
  const auto m = load_model("llama-2-7b");
  const auto hw = load_hardware("a100-sxm4-80gb");
  const double ddp = states_GB(run(m, hw, 8, "ddp"));
  const double z1 = states_GB(run(m, hw, 8, "zero1"));
  const double z2 = states_GB(run(m, hw, 8, "zero2"));
  const double z3 = states_GB(run(m, hw, 8, "zero3"));
  CHECK(ddp >= z1);
  CHECK(z1 >= z2);
  CHECK(z2 >= z3);
  // torch DDP under autocast keeps fp32 parameters, fp32 gradients and two fp32 Adam moments:
  // 16 bytes per parameter (its bucket copy of the gradients is a buffer, not a model state).
  CHECK(ddp == doctest::Approx(16 * 6738415616.0 / 1e9));
}

TEST_CASE("simulator::sharded memory does not grow with more GPUs") {
  const auto m = load_model("llama-2-13b");
  const auto hw = load_hardware("a100-sxm4-80gb");
  for (const char* s : {"zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op"}) {
    CAPTURE(s);
    double prev = 1e300, prev_peak = 1e300;
    for (int n : {8, 16, 32, 64, 128}) {
      const auto r = run(m, hw, n, s);
      CHECK(states_GB(r) <= prev);
      CHECK(r.peak_bytes <= prev_peak * (1 + 1e-9));
      prev = states_GB(r);
      prev_peak = r.peak_bytes;
    }
  }
}

TEST_CASE("simulator::time and memory invariants") {
  const auto hw = load_hardware("a100-sxm4-80gb");
  auto fast = hw;
  fast.intra_bandwidth_Bps *= 2;
  fast.inter_bandwidth_Bps *= 2;
  for (const char* model : {"gpt2", "llama-2-7b"}) {
    const auto m = load_model(model);
    for (const auto& s : strategy_names()) {
      for (int n : {8, 32}) {
        CAPTURE(model);
        CAPTURE(s);
        CAPTURE(n);
        const auto r = run(m, hw, n, s, Accounting::framework, std::int64_t{4} * n, 2);
        REQUIRE(r.valid);
        CHECK(r.step_s >= r.compute_s * (1 - 1e-12));
        CHECK(r.exposed_comm_s >= 0);
        double comm_busy = 0;
        for (int k = 1; k < kStreams; ++k) comm_busy += r.busy_s[k];
        CHECK(r.exposed_comm_s <= comm_busy * (1 + 1e-9) + 1e-12);
        // Every byte of the breakdown is in the peak, and the peak holds the model states.
        CHECK(total(r.at_peak) == doctest::Approx(r.peak_bytes));
        CHECK(r.peak_bytes >= total(r.model_states));
        // Faster links never slow a step.
        const auto rf = run(m, fast, n, s, Accounting::framework, std::int64_t{4} * n, 2);
        CHECK(rf.step_s <= r.step_s * (1 + 1e-12));
      }
    }
  }
}

TEST_CASE("simulator::zero3 all-gathers overlap forward compute") {
  const auto m = load_model("llama-2-7b");
  const auto hw = load_hardware("h100-sxm5-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {16, 8};
  in.job.seq_len = 4096;
  in.job.global_batch = 16;
  in.job.micro_batch = 1;
  in.spec = make_spec("zero3", std::nullopt, 8);
  Trace trace;
  const auto r = simulate_step(in, &trace);
  REQUIRE(r.valid);
  int overlapping = 0;
  for (const auto& ag : trace.spans) {
    if (ag.stream != Stream::all_gather) continue;
    for (const auto& c : trace.spans)
      if (c.stream == Stream::compute && c.name.rfind("forward", 0) == 0 &&
          c.start_s < ag.start_s + ag.duration_s && ag.start_s < c.start_s + c.duration_s)
        ++overlapping;
  }
  CHECK(overlapping >= 30);  // every block's all-gather runs under the previous block's forward
  CHECK(!trace.memory.empty());
}

TEST_CASE("simulator::infeasible plans are results with a reason") {
  const auto m = load_model("gpt2");
  const auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job.seq_len = 1024;
  in.job.global_batch = 8;
  in.job.micro_batch = 1;
  in.spec = make_spec("ddp", std::nullopt, 8);
  in.spec.offload = Offload::optimizer;
  auto r = simulate_step(in);
  CHECK_FALSE(r.valid);
  CHECK(r.reason == "ddp cannot offload: offload needs sharded optimizer states (ZeRO or FSDP)");
  in.spec = make_spec("zero2", std::nullopt, 8);
  in.spec.offload = Offload::params;
  r = simulate_step(in);
  CHECK_FALSE(r.valid);
  in.spec = make_spec("zero3", std::nullopt, 8);
  in.job.micro_batch = 3;
  r = simulate_step(in);
  CHECK_FALSE(r.valid);
}

TEST_CASE("simulator::offload moves optimizer states to the host") {
  const auto m = load_model("llama-2-7b");
  const auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job.seq_len = 2048;
  in.job.global_batch = 8;
  in.job.micro_batch = 1;
  in.spec = make_spec("zero2", std::nullopt, 8);
  const auto base = simulate_step(in);
  in.spec.offload = Offload::optimizer;
  const auto off = simulate_step(in);
  CHECK(off.model_states[static_cast<int>(Category::optimizer_states)] == 0);
  CHECK(off.peak_bytes < base.peak_bytes);
  CHECK(off.step_s > base.step_s);  // the CPU step and host transfers cost time
}

TEST_CASE("simulator::the loss decides the head's peak, and the peak names the loss") {
  // Llama-3-8B (V = 128256) at 8192 tokens, one GPU's micro-batch under FSDP2: the upcast path
  // holds 4 + 8 bytes per token and vocabulary entry at its backward (the fp32 log-probabilities
  // and the two fp32 gradients, torch's log_softmax/nll_loss), the fused kernel 2 + 2
  // (flash-attn's CrossEntropyLoss: the logits and their gradient), the chunked ones a chunk.
  const auto m = load_model("llama-3-8b");
  const auto hw = load_hardware("h200-sxm-141gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job.seq_len = 8192;
  in.job.global_batch = 8;
  in.job.micro_batch = 1;
  in.spec = make_spec("fsdp-full", Flavour::fsdp2, 8);
  auto peak_with = [&](const char* loss) {
    in.job.loss = LossImpl::upcast;
    set_loss(in.job, loss, "loss");
    return simulate_step(in);
  };
  const auto upcast = peak_with("upcast");
  const auto fused = peak_with("fused");
  const auto chunked = peak_with("chunked:8");
  const auto liger = peak_with("fused-linear");
  const double TV = 8192.0 * 128256.0;
  CHECK(upcast.peak_when.rfind("backward of the loss", 0) == 0);
  // The head's backward transient differs by 8·T·V − 2·T·V, its saved bytes by 4·T·V − (2·T·V +
  // 4·T): at the loss's backward the two paths differ by (12 − 4)·T·V less the 4·T statistics.
  CHECK(upcast.allocated_peak_bytes - fused.allocated_peak_bytes ==
        doctest::Approx(8 * TV - 4 * 8192.0).epsilon(0.01));
  CHECK(fused.allocated_peak_bytes > chunked.allocated_peak_bytes);
  CHECK(fused.allocated_peak_bytes > liger.allocated_peak_bytes);
  CHECK(liger.peak_when.rfind("backward of the loss", 0) != 0);
}

TEST_CASE("simulator::offload checks the node's host memory") {
  // DeepSpeed ZeRO-3 with the optimizer offloaded keeps the fp32 master and both moments (12 bytes
  // per parameter) and the fp32 gradient partition (4) in pinned host memory: 16 bytes per
  // parameter over the node's GPUs; llama-2-70b on one node of 8 needs 16·68.98e9 B ≈ 1028 GiB.
  const auto m = load_model("llama-2-70b");
  auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job.seq_len = 4096;
  in.job.global_batch = 8;
  in.job.micro_batch = 1;
  in.job.checkpointing = Checkpointing::full;
  in.spec = make_spec("zero3", std::nullopt, 8);
  in.spec.offload = Offload::optimizer;
  const auto fits = simulate_step(in);
  REQUIRE(fits.valid);
  CHECK(fits.host_bytes_per_node == doctest::Approx(16.0 * static_cast<double>(m.total_params())));
  hw.host_memory_bytes = 512.0 * 1073741824.0;
  const auto refused = simulate_step(in);
  CHECK_FALSE(refused.valid);
  CHECK(refused.reason.find("of host memory per node (8 GPUs") != std::string::npos);
  CHECK(refused.reason.find("the node has 512.0 GiB") != std::string::npos);
}

TEST_CASE("simulator::a CPU profile whose collectives overlap hides what compute covers") {
  // The same CPU device, its collectives blocking the computing thread or on threads of their
  // own: blocking exposes every collective (the step is compute plus all communication); on their
  // own streams the step can only be shorter, and the exposed communication at most the busy time
  // of the communication streams.
  const auto model = load_model("llama-2-7b");
  auto hw = load_hardware(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/executor/data/cpu-test.json");
  REQUIRE(hw.collectives_block);
  for (const char* strategy : {"ddp", "zero3", "fsdp-full"}) {
    CAPTURE(strategy);
    const auto blocking = run(model, hw, 4, strategy, Accounting::framework, 4, 1, 256);
    auto overlapped_hw = hw;
    overlapped_hw.collectives_block = false;
    const auto overlapped =
        run(model, overlapped_hw, 4, strategy, Accounting::framework, 4, 1, 256);
    CHECK(overlapped.step_s < blocking.step_s);
    CHECK(overlapped.exposed_comm_s < blocking.exposed_comm_s);
    CHECK(overlapped.compute_s == doctest::Approx(blocking.compute_s));
  }
}

TEST_CASE(
    "simulator::a blocking collective waits the straggler fraction of the compute before it") {
  // DDP on a blocking CPU profile: every compute of forward and backward precedes one of the
  // bucket all-reduces (the last at the end of backward); only the optimizer step follows the last.
  // So the waits add up to the fraction times the compute less the optimizer, and the step grows
  // by exactly that.
  const auto model = load_model("gpt2");
  auto hw = load_hardware(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/executor/data/cpu-test.json");
  REQUIRE(hw.collectives_block);
  hw.calibration = Calibration{};  // measured nothing else
  const auto before = run(model, hw, 2, "ddp", Accounting::framework, 2, 1, 256);
  CHECK(before.straggler_wait_s == 0);
  hw.calibration->straggler_wait = StragglerWait{0.1, 2, 1e-3, 40};
  const auto after = run(model, hw, 2, "ddp", Accounting::framework, 2, 1, 256);
  CHECK(after.straggler_wait_s == doctest::Approx(0.1 * (after.compute_s - after.optimizer_s)));
  CHECK(after.step_s - before.step_s == doctest::Approx(after.straggler_wait_s));
  CHECK(after.exposed_comm_s - before.exposed_comm_s == doctest::Approx(after.straggler_wait_s));
  CHECK(after.compute_s == doctest::Approx(before.compute_s));
  // On streams of their own (a GPU, or --collective-streams) nothing is added.
  hw.collectives_block = false;
  CHECK(run(model, hw, 2, "ddp", Accounting::framework, 2, 1, 256).straggler_wait_s == 0);
}

TEST_CASE("simulator::a bare parameter count computes as the model of that size and depth") {
  // llama-2-7b: 6,738,415,616 parameters in 32 blocks (Touvron et al. 2023, Table 1's 7B; the
  // preset's exact count). A --params model of that count and depth derives GPT-3's block from it
  // (12·h² GEMM weights): its GEMM and attention time must be the preset's within 2% (the preset's
  // embedding is a lookup, its head a GEMM; SwiGLU's three matrices hold what GELU's two do). The
  // memory-bound ops are each architecture's own (costmodel/traffic.hpp: GPT-3's LayerNorm and
  // GELU against Llama's RMSNorm, rotary and SwiGLU, and no loss over a vocabulary), so they are
  // not compared.
  const auto preset = load_model("llama-2-7b");
  const auto bare =
      model_from_param_count(static_cast<double>(preset.total_params()), preset.layers);
  CHECK(bare.total_params() == preset.total_params());
  CHECK(bare.block.matmul_params() > 0);
  const auto hw = load_hardware("a100-sxm4-80gb");
  const auto a = run(preset, hw, 8, "zero3", Accounting::framework, 8, 1, 4096);
  const auto b = run(bare, hw, 8, "zero3", Accounting::framework, 8, 1, 4096);
  auto flops_bound = [](const StepResult& r) {
    return r.compute_by_kind_s[static_cast<int>(ComputeKind::gemm)] +
           r.compute_by_kind_s[static_cast<int>(ComputeKind::attention)];
  };
  CHECK(flops_bound(b) == doctest::Approx(flops_bound(a)).epsilon(0.02));
}
