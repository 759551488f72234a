// The renderers of a chosen plan: the DeepSpeed config (round-tripped through the importer), the
// FSDP/torchtitan settings, and the SVG memory chart.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_reader.hpp"
#include "core/text.hpp"
#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "planner/deepspeed_import.hpp"
#include "planner/emit_deepspeed.hpp"
#include "planner/emit_fsdp.hpp"
#include "planner/estimate.hpp"
#include "planner/scenario.hpp"
#include "planner/svg_chart.hpp"

#include "cli_fixture.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using shardplan::test::error_of;
using namespace shardplan;
using namespace shardplan::costmodel;
using namespace shardplan::core;
using namespace shardplan::documents;
using planner::Evaluation;
using planner::Scenario;

namespace {

// llama-2-7b on 8 x a100-sxm4-80gb, seq 4096, global batch 32.
Scenario scenario(int gpus = 8) {
  Scenario sc;
  sc.model = load_model("llama-2-7b");
  sc.hardware = load_hardware("a100-sxm4-80gb");
  sc.cluster = {gpus, 8};
  sc.job.seq_len = 4096;
  sc.job.global_batch = std::int64_t{4} * gpus;
  return sc;
}

Evaluation plan(const Scenario& sc, const std::string& strategy, std::int64_t micro = 2,
                Precision precision = Precision::bf16_mixed, Offload offload = Offload::none,
                Checkpointing ckpt = Checkpointing::full, std::optional<Flavour> flavour = {}) {
  auto spec = make_spec(strategy, flavour, sc.cluster.gpus_per_node);
  spec.offload = offload;
  TrainingJob job = sc.job;
  job.micro_batch = micro;
  job.precision = precision;
  job.checkpointing = ckpt;
  job.checkpoint_every = ckpt == Checkpointing::every ? 2 : 0;
  return planner::evaluate(sc, spec, job);
}

// Every element opened is closed in order; comments and declarations are skipped.
bool balanced_tags(const std::string& xml, std::string& why) {
  std::vector<std::string> open;
  std::size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    const auto end = xml.find('>', i);
    if (end == std::string::npos) {
      why = "unterminated tag";
      return false;
    }
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    const bool closing = tag[0] == '/';
    const bool self_closing = tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \t\n/"));
    if (closing) {
      if (open.empty() || open.back() != name) {
        why = "</" + name + "> closes " + (open.empty() ? "nothing" : "<" + open.back() + ">");
        return false;
      }
      open.pop_back();
    } else if (!self_closing) {
      open.push_back(name);
    }
  }
  if (!open.empty()) why = "<" + open.back() + "> never closed";
  return open.empty();
}

}  // namespace

TEST_CASE("emit::deepspeed config round-trips through the importer") {
  const auto sc = scenario();
  struct Case {
    std::string strategy;
    std::int64_t micro;
    Precision precision;
    Offload offload;
  };
  const Case cases[] = {
      {"zero1", 1, Precision::bf16_mixed, Offload::none},
      {"zero1", 4, Precision::fp16_mixed, Offload::optimizer},
      {"zero2", 2, Precision::bf16_mixed, Offload::none},
      {"zero2", 1, Precision::fp32, Offload::optimizer},
      {"zero3", 2, Precision::bf16_mixed, Offload::none},
      {"zero3", 1, Precision::bf16_mixed, Offload::optimizer},
      {"zero3", 4, Precision::bf16, Offload::params},
      {"zero3", 1, Precision::fp16_mixed, Offload::params},
      {"ddp", 1, Precision::bf16_mixed, Offload::none},
  };
  for (const auto& c : cases) {
    CAPTURE(c.strategy);
    CAPTURE(c.micro);
    const std::string precision = precision_name(c.precision), offload = offload_name(c.offload);
    CAPTURE(precision);
    CAPTURE(offload);
    // DeepSpeed's engine at every stage (ddp: its stage 0).
    const auto e = plan(sc, c.strategy, c.micro, c.precision, c.offload, Checkpointing::full,
                        Flavour::deepspeed);
    REQUIRE(e.result.valid);
    const auto ds = planner::deepspeed_config(sc, e);
    // As a user would get it: printed, then read back from text, with the checkpointing the
    // model code sets given on the command line (a DeepSpeed config has no switch for it).
    Scenario base = sc;
    base.job.checkpointing = e.job.checkpointing;
    const auto back =
        planner::import_deepspeed_config(parse_json_text(ds.dump(2), "ds_config.json"), base);
    CHECK(back.spec.strategy == c.strategy);
    CHECK(back.job.micro_batch == c.micro);
    CHECK(back.job.global_batch == 32);
    CHECK(back.job.precision == c.precision);
    CHECK(back.spec.offload == c.offload);
    CHECK(ds["gradient_accumulation_steps"] == e.result.grad_accumulation);
    CHECK(back.spec.reduce_bucket_bytes == e.spec.reduce_bucket_bytes);
    CHECK(back.spec.allgather_bucket_bytes == e.spec.allgather_bucket_bytes);
    // The whole spec and job, not only the fields above.
    CHECK(spec_to_json(back.spec) == spec_to_json(e.spec));
    CHECK(job_to_json(back.job) == job_to_json(e.job));
    // Evaluating the imported plan gives the same accumulation and peak.
    const auto again = planner::evaluate(sc, back.spec, back.job);
    CHECK(again.result.grad_accumulation == e.result.grad_accumulation);
    CHECK(again.result.peak_bytes == doctest::Approx(e.result.peak_bytes));
  }
}

TEST_CASE("emit::deepspeed keys and units") {
  const auto sc = scenario();
  const auto z3 =
      planner::deepspeed_config(sc, plan(sc, "zero3", 2, Precision::bf16_mixed, Offload::params));
  CHECK(z3["train_batch_size"] == 32);
  CHECK(z3["train_micro_batch_size_per_gpu"] == 2);
  CHECK(z3["gradient_accumulation_steps"] == 2);
  CHECK(z3["bf16"]["enabled"] == true);
  CHECK(z3["fp16"]["enabled"] == false);
  const auto& z = z3["zero_optimization"];
  CHECK(z["stage"] == 3);
  // DeepSpeed's defaults in elements (zero/config.py): 5e8, 5e7, 1e5.
  CHECK(z["reduce_bucket_size"] == 500'000'000);
  CHECK(z["stage3_prefetch_bucket_size"] == 50'000'000);
  CHECK(z["stage3_param_persistence_threshold"] == 100'000);
  CHECK(z["stage3_max_live_parameters"] == 1'000'000'000);
  CHECK(z["overlap_comm"] == true);
  CHECK(z["offload_optimizer"] == nlohmann::json{{"device", "cpu"}, {"pin_memory", true}});
  CHECK(z["offload_param"] == nlohmann::json{{"device", "cpu"}, {"pin_memory", true}});
  CHECK(z3.contains("activation_checkpointing"));
  CHECK(contains(z3["comment"].get<std::string>(), "gradient_checkpointing_enable"));

  const auto z2 = planner::deepspeed_config(sc, plan(sc, "zero2", 2, Precision::fp16_mixed));
  CHECK(z2["zero_optimization"]["stage"] == 2);
  CHECK(z2["zero_optimization"]["allgather_bucket_size"] == 500'000'000);
  CHECK_FALSE(z2["zero_optimization"].contains("offload_optimizer"));
  CHECK_FALSE(z2["zero_optimization"].contains("stage3_prefetch_bucket_size"));
  CHECK(z2["fp16"]["enabled"] == true);
  CHECK(z2["fp16"]["loss_scale"] == 0);  // dynamic loss scaling
  CHECK(z2["fp16"]["initial_scale_power"] == 16);

  const auto ddp =
      planner::deepspeed_config(sc, plan(sc, "ddp", 1, Precision::bf16_mixed, Offload::none,
                                         Checkpointing::none, Flavour::deepspeed));
  CHECK(ddp["zero_optimization"] == nlohmann::json{{"stage", 0}});
  CHECK_FALSE(ddp.contains("activation_checkpointing"));
  // The plan's in-place Adam is DeepSpeed's FusedAdam, which the engine builds from this section
  // (and which makes bf16 at stage 0 run FP16_Optimizer's one flat master).
  CHECK(ddp["optimizer"] == nlohmann::json{{"type", "AdamW"}});
  CHECK(contains(ddp["comment"].get<std::string>(), "FusedAdam's defaults apply"));
  // PyTorch's DDP is not a DeepSpeed plan.
  CHECK(error_of([&] { planner::deepspeed_config(sc, plan(sc, "ddp")); }) ==
        "--emit: the ddp plan runs ddp, not DeepSpeed's engine; plan it with --flavour deepspeed "
        "(stage 0 for ddp)");

  // A plan with BF16_Optimizer's fp32 accumulation (data_types.grad_accum_dtype) says so, and reads
  // back the same.
  auto accum = plan(sc, "zero1", 2, Precision::bf16_mixed);
  accum.spec.grad_accum_dtype = DType::fp32;
  accum = planner::evaluate(sc, accum.spec, accum.job);
  const auto bf16opt = planner::deepspeed_config(sc, accum);
  CHECK(bf16opt["data_types"] == nlohmann::json{{"grad_accum_dtype", "fp32"}});
  Scenario base = sc;
  base.job.checkpointing = accum.job.checkpointing;
  const auto read = planner::import_deepspeed_config(bf16opt, base);
  CHECK(spec_to_json(read.spec) == spec_to_json(accum.spec));
  CHECK(planner::evaluate(sc, read.spec, read.job).result.peak_bytes ==
        doctest::Approx(accum.result.peak_bytes));

  const auto pure = planner::deepspeed_config(sc, plan(sc, "zero1", 2, Precision::bf16));
  CHECK(pure["bf16"]["bf16_master_weights_and_grads"] == true);
  CHECK(pure["bf16"]["bf16_optimizer_states"] == true);
}

TEST_CASE("emit::deepspeed refuses plans DeepSpeed does not run") {
  const auto sc = scenario(16);
  for (const char* s : {"fsdp-full", "fsdp-grad-op", "hsdp"})
    CHECK(error_of([&] { planner::deepspeed_config(sc, plan(sc, s)); }) ==
          std::string("--emit: ") + s + " is a PyTorch FSDP plan; use --emit fsdp");
  CHECK(
      error_of([&] {
        planner::deepspeed_config(sc, plan(sc, "ddp", 2, Precision::bf16, Offload::none,
                                           Checkpointing::full, Flavour::deepspeed));
      }) ==
      "--emit: pure bf16 (bf16_master_weights_and_grads) needs ZeRO stage 1, 2 or 3 in DeepSpeed; "
      "plan zero1 or use --precision bf16-mixed");
  const auto invalid = plan(sc, "zero2", 2, Precision::bf16_mixed, Offload::params);
  REQUIRE_FALSE(invalid.result.valid);
  CHECK(error_of([&] { planner::deepspeed_config(sc, invalid); }) ==
        "--emit: the zero2 plan is not runnable: " + invalid.result.reason);
}

TEST_CASE("emit::fsdp settings per strategy") {
  const auto sc = scenario(16);  // 2 nodes of 8

  const auto full = planner::fsdp_settings(sc, plan(sc, "fsdp-full"));
  CHECK(contains(full, "reshard_after_forward=True"));
  CHECK(contains(full, "mesh = init_device_mesh(\"cuda\", (16,), mesh_dim_names=(\"dp_shard\",))"));
  CHECK(contains(full,
                 "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)"));
  CHECK(contains(full, "offload_policy = OffloadPolicy()"));
  CHECK(contains(full, "every_n_layers=1)  # transformers; checkpointing full"));
  CHECK(contains(full, "data_parallel_shard_degree = 16\n"));
  CHECK(contains(full, "data_parallel_replicate_degree = 1\n"));
  CHECK(contains(full, "fsdp_reshard_after_forward = \"default\""));
  CHECK(contains(full, "[activation_checkpoint]\nmode = \"full\""));
  CHECK(contains(full, "local_batch_size = 2\nglobal_batch_size = 64\n"));
  CHECK(contains(full, "mixed_precision_param = \"bfloat16\""));
  // torchtitan reduces only in float32; this plan reduces in bf16, so the key is a comment.
  CHECK(contains(full, "# mixed_precision_reduce = \"float32\" is torchtitan's only choice"));

  const auto grad_op =
      planner::fsdp_settings(sc, plan(sc, "fsdp-grad-op", 1, Precision::bf16_mixed, Offload::params,
                                      Checkpointing::selective_op));
  CHECK(contains(grad_op, "reshard_after_forward=False"));
  CHECK_FALSE(contains(grad_op, "reshard_after_forward=True"));
  CHECK(contains(grad_op, "fsdp_reshard_after_forward = \"never\""));
  CHECK(contains(grad_op, "CPUOffloadPolicy(pin_memory=True)"));
  CHECK(contains(grad_op, "enable_cpu_offload = true"));
  // torchtitan's op-level policy: 0.2.x's TOML keys and 0.3.0's SelectiveAC class
  // (torchtitan/distributed/activation_checkpoint.py).
  CHECK(contains(grad_op, "mode = \"selective\"\nselective_ac_option = \"op\""));
  CHECK(contains(grad_op, "SelectiveAC(SelectiveAC.Config()).apply(model)"));

  const auto hsdp = planner::fsdp_settings(sc, plan(sc, "hsdp"));
  CHECK(contains(
      hsdp, "init_device_mesh(\"cuda\", (2, 8), mesh_dim_names=(\"dp_replicate\", \"dp_shard\"))"));
  CHECK(contains(hsdp, "data_parallel_replicate_degree = 2\n"));
  CHECK(contains(hsdp, "data_parallel_shard_degree = 8\n"));
  CHECK(contains(hsdp, "reshard_after_forward=True"));

  const auto hsdp1 =
      planner::fsdp_settings(sc, plan(sc, "hsdp", 2, Precision::bf16_mixed, Offload::none,
                                      Checkpointing::full, Flavour::fsdp1));
  CHECK(contains(hsdp1, "sharding_strategy=ShardingStrategy.HYBRID_SHARD"));
  CHECK(contains(hsdp1, "limit_all_gathers=True"));
  CHECK(contains(hsdp1, "data_parallel_replicate_degree = 2\n"));

  const auto ddp = planner::fsdp_settings(
      sc, plan(sc, "ddp", 1, Precision::bf16_mixed, Offload::none, Checkpointing::none));
  CHECK(contains(
      ddp, "DDP(model, device_ids=[local_rank], bucket_cap_mb=25, gradient_as_bucket_view=False)"));
  CHECK(contains(ddp, "data_parallel_replicate_degree = 16\n"));
  CHECK(contains(ddp, "data_parallel_shard_degree = 1\n"));
  CHECK(contains(ddp, "model.no_sync()"));
  CHECK_FALSE(contains(ddp, "fsdp_reshard_after_forward"));
  CHECK(contains(ddp, "mode = \"none\""));
}

TEST_CASE("emit::fsdp refuses ZeRO plans and unrunnable ones") {
  const auto sc = scenario();
  for (const char* s : {"zero1", "zero2", "zero3"})
    CHECK(error_of([&] { planner::fsdp_settings(sc, plan(sc, s)); }) ==
          std::string("--emit: ") + s + " is a DeepSpeed plan; use --emit deepspeed");
  const auto optimizer_only = plan(sc, "fsdp-full", 2, Precision::bf16_mixed, Offload::optimizer);
  REQUIRE_FALSE(optimizer_only.result.valid);
  CHECK(error_of([&] { planner::fsdp_settings(sc, optimizer_only); }) ==
        "--emit: the fsdp-full plan is not runnable: " + optimizer_only.result.reason);
}

TEST_CASE("svg::memory chart is well-formed and marks what does not fit") {
  auto sc = scenario();
  sc.model.name = "llama <7b> & \"friends\"";  // every text is escaped
  std::vector<Evaluation> best = {
      plan(sc, "ddp", 1, Precision::bf16_mixed, Offload::none, Checkpointing::none),
      plan(sc, "zero2", 1),
      plan(sc, "zero3", 2),
      plan(sc, "fsdp-full", 2),
      plan(sc, "zero2", 1, Precision::bf16_mixed, Offload::params),  // not runnable
  };
  REQUIRE_FALSE(best[0].fits);  // 16 bytes per parameter replicated: over 80 GiB
  REQUIRE(best[2].fits);
  const auto svg = planner::memory_svg(sc, best);
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  std::string why;
  CHECK_MESSAGE(balanced_tags(svg, why), why);
  CHECK(contains(svg, "<line id=\"capacity\""));
  CHECK(contains(svg, "<line id=\"usable\""));
  CHECK(contains(svg, "stroke-dasharray=\"6 4\""));
  CHECK(contains(svg, "capacity 80.00 GiB"));
  CHECK(contains(svg, "usable 76.00 GiB</text>"));
  CHECK(contains(svg, "(5% headroom)</text>"));
  CHECK(contains(svg, "llama &lt;7b&gt; &amp; &quot;friends&quot;"));
  CHECK_FALSE(contains(svg, "<7b>"));
  CHECK(contains(svg, "data-fits=\"false\""));
  CHECK(contains(svg, "does not fit</text>"));
  CHECK(contains(svg, "not runnable"));
  for (const char* colour :
       {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#59a14f", "#bab0ac"})
    CHECK(contains(svg, colour));
  CHECK(contains(svg, "GiB per GPU"));

  const auto empty = planner::memory_svg(sc, {});
  CHECK(balanced_tags(empty, why));
  CHECK(contains(empty, "no plans"));
  CHECK(planner::xml_escape("a<b>&'\"") == "a&lt;b&gt;&amp;&apos;&quot;");
}

// Every label of a layout on its canvas, no two overlapping, none across a row's capacity or
// usable line.
void check_labels_apart(const planner::ChartLayout& L) {
  for (std::size_t i = 0; i < L.texts.size(); ++i) {
    const auto& a = L.texts[i];
    INFO("label \"" << a.text << "\"");
    CHECK(a.left >= 0);
    CHECK(a.top >= 0);
    CHECK(a.right <= L.width);
    CHECK(a.bottom <= L.height);
    for (const auto& row : L.rows)
      for (double ly : {row.capacity_y, row.usable_y})
        CHECK_FALSE((a.right > row.plot_left && a.left < row.plot_right && a.top < ly + 1 &&
                     a.bottom > ly - 1));
    for (std::size_t k = i + 1; k < L.texts.size(); ++k) {
      const auto& b = L.texts[k];
      INFO("and \"" << b.text << "\"");
      CHECK_FALSE((a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom));
    }
  }
}

TEST_CASE("svg::layout keeps every label apart, on the canvas and off the capacity lines") {
  // 16 GPUs: HSDP's default shard group is a node of 8, so 2 replicas.
  const auto sc = scenario(16);
  std::vector<Evaluation> best = {
      plan(sc, "ddp", 1, Precision::bf16_mixed, Offload::none, Checkpointing::none),
      plan(sc, "zero2", 1),
      plan(sc, "hsdp", 2),
      plan(sc, "fsdp-full", 2, Precision::bf16_mixed, Offload::none, Checkpointing::none),
      plan(sc, "zero2", 1, Precision::bf16_mixed, Offload::params),  // not runnable
  };
  REQUIRE_FALSE(best[0].fits);
  REQUIRE(best[2].fits);
  REQUIRE_FALSE(best[4].result.valid);
  const auto L = planner::chart_layout(sc, best);

  // The axis is scaled to the capacity (80 GiB) and the bars near it, not to DDP's bar: 16 bytes
  // per parameter of 6.74 B parameters alone are 100 GiB, so DDP's bar is broken at the top.
  const double gib = 1024.0 * 1024.0 * 1024.0;
  CHECK(L.axis_top_gib >= 80);
  CHECK(L.axis_top_gib < best[0].result.peak_bytes / gib);
  REQUIRE(L.bars.size() == best.size());
  CHECK(L.bars[0].broken);
  CHECK(L.bars[0].y_top < L.plot_top);
  CHECK(L.bars[0].y_top >= L.plot_top - 14);
  for (std::size_t i = 1; i < 4; ++i) CHECK_FALSE(L.bars[i].broken);

  auto has_text = [&](const std::string& t) {
    return std::any_of(L.texts.begin(), L.texts.end(), [&](const auto& x) { return x.text == t; });
  };
  CHECK(has_text("hsdp (fsdp2)"));
  CHECK(has_text("shard group 8 x 2 replicas"));
  CHECK(has_text("replicated on 16 GPUs"));
  CHECK(has_text("sharded over 16 GPUs"));
  char ddp_total[32];
  std::snprintf(ddp_total, sizeof ddp_total, "%.0f GiB", best[0].result.peak_bytes / gib);
  CHECK(has_text(ddp_total));  // the broken bar's total, written
  CHECK(has_text("does not fit"));
  CHECK(has_text("not runnable"));
  CHECK(has_text("capacity 80.00 GiB"));
  CHECK(has_text("logits and loss (head activations)"));

  // The head's activations are their own segment wherever the simulator found them at the peak,
  // and the segments of a bar that is not broken add up to its peak.
  for (std::size_t i = 1; i < 4; ++i) {
    const auto& b = L.bars[i];
    const auto& r = best[i].result;
    double sum = 0;
    bool head = false;
    for (const auto& seg : b.segments) {
      sum += seg.gib;
      if (seg.category == 4) {
        head = true;
        CHECK(seg.gib == doctest::Approx(r.head_activations_at_peak / gib));
      }
    }
    CHECK(sum == doctest::Approx(r.peak_bytes / gib));
    CHECK(head == (r.head_activations_at_peak > 0));
  }

  check_labels_apart(L);
}

TEST_CASE("svg::many families wrap into rows on one scale, and a broken bar names what it hides") {
  // 9 and 13 families (the same plans again: the chart does not care): rows of at most 6, as
  // even as they come (5 + 4; 5 + 4 + 4), each row with its own axis and capacity lines.
  const auto sc = scenario();
  const std::vector<Evaluation> some = {
      plan(sc, "ddp", 1, Precision::bf16_mixed, Offload::none, Checkpointing::none),
      plan(sc, "zero2", 1), plan(sc, "zero3", 2), plan(sc, "fsdp-full", 2), plan(sc, "zero1", 1)};
  REQUIRE_FALSE(some[0].fits);
  for (const std::size_t n : {std::size_t{9}, std::size_t{13}}) {
    std::vector<Evaluation> best;
    for (std::size_t i = 0; i < n; ++i) best.push_back(some[i % some.size()]);
    const auto L = planner::chart_layout(sc, best);
    const std::size_t rows = n == 9 ? 2 : 3;
    REQUIRE(L.rows.size() == rows);
    CHECK(L.bars[0].row == 0);
    CHECK(L.bars[4].row == 0);
    CHECK(L.bars[5].row == 1);
    CHECK(L.bars.back().row == static_cast<int>(rows) - 1);
    for (std::size_t r = 1; r < rows; ++r) {
      CHECK(L.rows[r].plot_top > L.rows[r - 1].base);
      CHECK(L.rows[r].plot_right == L.rows[0].plot_right);  // the same slots in every row
    }
    // No wider than one row of five slots and the legend beside it, whatever n.
    CHECK(L.width == planner::chart_layout(sc, some).width);
    check_labels_apart(L);
  }

  // DDP's bar is broken: the categories above the axis's top are named under it with their
  // whole size (the optimizer states and what lies on them).
  const auto L = planner::chart_layout(sc, some);
  REQUIRE(L.bars[0].broken);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const auto& r = some[0].result;
  const double below_optimizer = (r.at_peak[0] + r.at_peak[1]) / gib;
  REQUIRE(below_optimizer < L.axis_top_gib);  // the optimizer states reach above the axis
  char optimizer[64];
  const double g = r.at_peak[2] / gib;
  std::snprintf(optimizer, sizeof optimizer,
                g >= 100 ? "optimizer states %.0f GiB" : "optimizer states %.1f GiB", g);
  auto has_text = [&](const std::string& t) {
    return std::any_of(L.texts.begin(), L.texts.end(), [&](const auto& x) { return x.text == t; });
  };
  CHECK(has_text("above the axis:"));
  CHECK(has_text(optimizer));
  const auto svg = planner::memory_svg(sc, some);
  CHECK(svg.find("width=\"100%\"") != std::string::npos);
  CHECK(svg.find("viewBox=\"0 0 ") != std::string::npos);
}

TEST_CASE("svg::text widths are estimated on the wide side") {
  // DejaVu Sans, rounded up: digits 0.64 em, "M" 0.9 em; bold 12% wider.
  CHECK(planner::text_width("10", 10, false) == doctest::Approx(12.8));
  CHECK(planner::text_width("M", 10, true) == doctest::Approx(10.08));
  CHECK(planner::text_width("", 11, false) == 0);
}

// Left whole: one trace read once, then checked lane by lane (names, the host lane, the flows).
TEST_CASE("trace::processes and threads named, the CPU optimizer on its own lane, all-gathers flow "
          "to compute") {
  const auto sc = scenario();
  auto spec = make_spec("zero3", std::nullopt, sc.cluster.gpus_per_node);
  spec.offload = Offload::optimizer;
  TrainingJob job = sc.job;
  job.micro_batch = 2;
  job.checkpointing = Checkpointing::full;
  Trace trace;
  const auto e = planner::evaluate(sc, spec, job, &trace);
  REQUIRE(e.result.valid);
  REQUIRE(e.result.host_optimizer_s > 0);
  // The trace as the program writes it, read back.
  const auto doc = nlohmann::json::parse(core::json_text(planner::trace_to_chrome_json(trace)));
  const auto& events = doc.at("traceEvents");

  std::map<std::pair<int, int>, std::string> threads;
  std::map<int, std::string> processes;
  for (const auto& ev : events) {
    if (ev.at("ph") != "M") continue;
    if (ev.at("name") == "process_name") processes[ev.at("pid")] = ev.at("args").at("name");
    if (ev.at("name") == "thread_name")
      threads[{ev.at("pid"), ev.at("tid")}] = ev.at("args").at("name");
  }
  CHECK(processes ==
        std::map<int, std::string>{{1, "GPU (one rank, simulated step)"}, {2, "host CPUs"}});
  CHECK(threads == std::map<std::pair<int, int>, std::string>{{{1, 0}, "compute"},
                                                              {{1, 1}, "all-gather"},
                                                              {{1, 2}, "reduce-scatter"},
                                                              {{1, 3}, "all-reduce"},
                                                              {{1, 4}, "host transfers"},
                                                              {{2, 0}, "CPU optimizer"}});

  // The optimizer lane holds the CPU optimizer step, as long as the summary says it took.
  double optimizer_us = 0;
  int optimizer_spans = 0;
  for (const auto& ev : events)
    if (ev.at("ph") == "X" && ev.at("pid") == 2) {
      CHECK(ev.at("name") == "CPU optimizer step");
      optimizer_us += ev.at("dur").get<double>();
      ++optimizer_spans;
    }
  CHECK(optimizer_spans == 1);
  CHECK(optimizer_us == doctest::Approx(e.result.host_optimizer_s * 1e6));
  const auto table = planner::evaluation_table(sc, e);
  CHECK(contains(table, "optimizer step on the host's CPUs"));
  CHECK(contains(table, planner::seconds(e.result.host_optimizer_s)));
  CHECK_FALSE(contains(table, "    optimizer step "));  // no compute-stream line saying 0
  // The host transfers' lane holds the transfers alone, and the summary's busy time is theirs.
  double transfers_us = 0;
  for (const auto& ev : events)
    if (ev.at("ph") == "X" && ev.at("pid") == 1 && ev.at("tid") == 4)
      transfers_us += ev.at("dur").get<double>();
  const double transfers_s =
      e.result.busy_s[static_cast<int>(Stream::host)] - e.result.host_optimizer_s;
  CHECK(transfers_us == doctest::Approx(transfers_s * 1e6));
  CHECK(contains(table, "(busy " + planner::seconds(transfers_s) + ")\n"));

  // Every flow start (on an all-gather) has one end, bound to a compute span starting no earlier.
  std::map<int, nlohmann::json> starts, ends;
  std::vector<std::pair<double, double>> gathers, computes;  // (start, end) in µs
  for (const auto& ev : events) {
    if (ev.at("ph") == "s") CHECK(starts.emplace(ev.at("id").get<int>(), ev).second);
    if (ev.at("ph") == "f") CHECK(ends.emplace(ev.at("id").get<int>(), ev).second);
    if (ev.at("ph") == "X" && ev.at("pid") == 1) {
      const double ts = ev.at("ts"), dur = ev.at("dur");
      if (ev.at("tid") == 1 && ev.at("name").get<std::string>().rfind("all-gather ", 0) == 0)
        gathers.emplace_back(ts, ts + dur);
      if (ev.at("tid") == 0) computes.emplace_back(ts, ts + dur);
    }
  }
  REQUIRE_FALSE(gathers.empty());
  CHECK(starts.size() == gathers.size());  // ZeRO-3 gathers each unit before its compute
  CHECK(ends.size() == starts.size());
  for (const auto& start : starts) {
    const auto id = start.first;  // a copy: doctest's INFO cannot capture a structured binding
    const auto& s = start.second;
    INFO("flow " << id);
    REQUIRE(ends.count(id) == 1);
    const auto& f = ends.at(id);
    CHECK(f.at("bp") == "e");
    CHECK(s.at("tid") == 1);
    CHECK(f.at("tid") == 0);
    CHECK(s.at("pid") == 1);
    CHECK(f.at("pid") == 1);
    const double sts = s.at("ts"), fts = f.at("ts");
    CHECK(std::any_of(gathers.begin(), gathers.end(),
                      [&](auto g) { return g.first <= sts && sts <= g.second; }));
    // The end is bound to the compute span that starts there, after the gather it leaves from.
    const auto gather = std::find_if(gathers.begin(), gathers.end(),
                                     [&](auto g) { return g.first <= sts && sts <= g.second; });
    CHECK(fts >= gather->second * (1 - 1e-9));
    CHECK(std::any_of(computes.begin(), computes.end(), [&](auto c) { return c.first == fts; }));
  }
}

TEST_CASE("emit::every other block checkpointed, as code and as torchtitan 0.2.x keys") {
  // torchtitan 0.2.x: mode = "selective", selective_ac_option = "2" checkpoints every 2nd block;
  // the PyTorch snippets wrap the same blocks with checkpoint_wrapper; DeepSpeed gets its
  // activation_checkpointing section and the sentence that the model switches it on.
  auto sc = scenario();
  const auto hf = planner::fsdp_settings(
      sc, plan(sc, "fsdp-full", 2, Precision::bf16_mixed, Offload::none, Checkpointing::every));
  // transformers counts from layer 0: its own switch, as the plan counted.
  CHECK(contains(
      hf,
      "model.activation_checkpointing_enable(activation_checkpointing_kwargs={\"use_reentrant\": "
      "False}, every_n_layers=2)"));
  sc.job.recipe = Recipe::torchtitan;
  const auto e =
      plan(sc, "fsdp-full", 2, Precision::bf16_mixed, Offload::none, Checkpointing::every);
  const auto fsdp = planner::fsdp_settings(sc, e);
  CHECK(contains(fsdp, "    if (int(name) + 1) % 2 == 0:"));
  CHECK(contains(fsdp, "mode = \"selective\"\nselective_ac_option = \"2\""));
  const auto z3 = planner::deepspeed_config(
      sc, plan(sc, "zero3", 2, Precision::bf16_mixed, Offload::none, Checkpointing::every));
  CHECK(z3.contains("activation_checkpointing"));
  CHECK(contains(z3["comment"].get<std::string>(), "Checkpointing one block in 2"));
}

TEST_CASE("emit::the reduce dtype follows the precision, as the frameworks default it") {
  // DeepSpeed (engine.py, communication_data_type): the fp16/bf16 training dtype, else fp32. FSDP
  // (MixedPrecision / MixedPrecisionPolicy): reduce_dtype defaults to param_dtype. torchtitan:
  // mixed_precision_reduce "float32" only.
  using planner::testing::planner;
  const std::vector<std::string> base = {"recommend",      "--model",        "gpt2", "--hardware",
                                         "a100-sxm4-80gb", "--gpus",         "8",    "--seq-len",
                                         "1024",           "--global-batch", "16"};
  auto run = [&](std::vector<std::string> more) {
    auto a = base;
    a.insert(a.end(), more.begin(), more.end());
    return planner(a);
  };
  const std::pair<const char*, const char*> ds_cases[] = {
      {"fp32", "fp32"}, {"fp16-mixed", "fp16"}, {"bf16-mixed", "bf16"}};
  for (const auto& ds_case : ds_cases) {
    const char* precision = ds_case.first;  // doctest's CAPTURE cannot capture a structured binding
    const char* want = ds_case.second;
    CAPTURE(precision);
    const auto r = run({"--precision", precision, "--emit", "deepspeed"});
    REQUIRE(r.code == 0);
    const auto ds = nlohmann::json::parse(r.out);
    CHECK(ds["communication_data_type"] == want);
    // The search was narrowed to DeepSpeed's plans, and stderr says so in one line.
    const int stage = ds["zero_optimization"]["stage"].get<int>();
    CHECK((stage >= 0 && stage <= 3));
    CHECK(r.err == "planner: --emit deepspeed: searching DeepSpeed's plans only (ZeRO stages 0-3, "
                   "as --flavour deepspeed)\n");
  }
  const auto fp32 = run(
      {"--precision", "fp32", "--strategy", "fsdp-full", "--flavour", "fsdp2", "--emit", "fsdp"});
  REQUIRE(fp32.code == 0);
  CHECK(contains(fp32.out,
                 "MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)"));
  CHECK(contains(fp32.out, "mixed_precision_reduce = \"float32\"\n"));
  const auto fp16 = run({"--precision", "fp16-mixed", "--strategy", "fsdp-full", "--flavour",
                         "fsdp1", "--emit", "fsdp"});
  REQUIRE(fp16.code == 0);
  CHECK(
      contains(fp16.out, "MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16)"));
  const auto titan = run({"--recipe", "torchtitan", "--strategy", "fsdp-full", "--emit", "fsdp"});
  REQUIRE(titan.code == 0);
  CHECK(contains(titan.out,
                 "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"));
  CHECK(contains(titan.out, "--training.mixed_precision_reduce float32 \\\n"));
  // The plan document the executor reads: fp32 reduction for an fp32 job.
  const auto plan = run({"--precision", "fp32", "--strategy", "zero2", "--emit", "plan"});
  REQUIRE(plan.code == 0);
  CHECK(nlohmann::json::parse(plan.out)["sharding"]["reduce_dtype"] == "fp32");
}

TEST_CASE("emit::DeepSpeed buckets hold 5e8 elements of the reduce dtype") {
  // zero/config.py: reduce_bucket_size = allgather_bucket_size = 5e8 elements; fp32 elements are
  // 4 bytes, so 2e9 bytes each for an fp32 job, 1e9 for bf16.
  const auto zero2 = make_spec("zero2", Flavour::deepspeed, 8);
  TrainingJob job;
  job.precision = Precision::fp32;
  const auto fp32 = planner::with_job_precision(zero2, job);
  CHECK(fp32.reduce_dtype == DType::fp32);
  CHECK(fp32.reduce_bucket_bytes == 2e9);
  CHECK(fp32.allgather_bucket_bytes == 2e9);
  job.precision = Precision::bf16_mixed;
  const auto bf16 = planner::with_job_precision(zero2, job);
  CHECK(bf16.reduce_dtype == DType::bf16);
  CHECK(bf16.reduce_bucket_bytes == 1e9);
  // DDP reduces the fp32 parameters' gradients under autocast: unchanged.
  CHECK(planner::with_job_precision(make_spec("ddp", std::nullopt, 8), job).reduce_dtype ==
        DType::fp32);
}

TEST_CASE("emit::torchtitan options for 0.2.x (TOML) and 0.3.0 (command line)") {
  // Option names of torchtitan 0.2.2 (torchtitan/config/job_config.py) and 0.3.0
  // (torchtitan/config/configs.py; activation checkpointing subcommands in
  // torchtitan/distributed/activation_checkpoint.py).
  const auto sc = scenario(16);
  const auto hsdp =
      planner::fsdp_settings(sc, plan(sc, "hsdp", 1, Precision::bf16_mixed, Offload::none,
                                      Checkpointing::selective_op, Flavour::fsdp2));
  CHECK(contains(hsdp, "# ---- torchtitan 0.2.x (0.2.0-0.2.2) job config"));
  CHECK(contains(hsdp, "# ---- torchtitan 0.3.0 command line"));
  CHECK(contains(
      hsdp, "torchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train --module <model> --config "
            "<config> \\\n"));
  CHECK(contains(hsdp, "  --parallelism.data_parallel_replicate_degree 2 \\\n"));
  CHECK(contains(hsdp, "  --parallelism.data_parallel_shard_degree 8 \\\n"));
  CHECK(contains(hsdp, "  --training.no_enable_cpu_offload \\\n"));
  CHECK(contains(hsdp, "  activation_checkpoint:selective\n"));
  const auto pure =
      planner::fsdp_settings(sc, plan(sc, "fsdp-full", 1, Precision::bf16, Offload::params,
                                      Checkpointing::none, Flavour::fsdp2));
  CHECK(contains(pure, "dtype = \"bfloat16\"  # pure bf16"));
  CHECK(contains(pure, "  --training.dtype bfloat16 \\\n"));
  CHECK(contains(pure, "  --training.enable_cpu_offload \\\n"));
  CHECK(contains(pure, "  activation_checkpoint:none\n"));
}

// The FSDP snippets wrap the blocks where the recipe's model code keeps them (transformers 5.23:
// LlamaForCausalLM.model.layers of LlamaDecoderLayer, GPT2LMHeadModel.transformer.h of GPT2Block;
// torchtitan 0.3.0: model.layers of Llama3TransformerBlock), and a model given by its parameter
// count says what to fill in. (tests/planner/fsdp_snippet_run.py runs them on the models.)
TEST_CASE("emit::fsdp wraps the blocks where the model code keeps them") {
  using planner::testing::planner;
  auto run = [](const std::string& model, std::vector<std::string> more) {
    const bool params = model.rfind("params:", 0) == 0;  // a bare parameter count
    std::vector<std::string> a = {"recommend",
                                  params ? "--params" : "--model",
                                  params ? model.substr(7) : model,
                                  "--hardware",
                                  "a100-sxm4-80gb",
                                  "--gpus",
                                  "8",
                                  "--seq-len",
                                  "1024",
                                  "--global-batch",
                                  "16",
                                  "--strategy",
                                  "fsdp-full",
                                  "--emit",
                                  "fsdp"};
    a.insert(a.end(), more.begin(), more.end());
    const auto r = planner(a);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    return r.out;
  };
  const auto llama2 = run("llama-3-8b", {"--flavour", "fsdp2", "--recipe", "hf"});
  CHECK(contains(llama2, "for block in model.model.layers.children():"));
  const auto llama1 = run("llama-3-8b", {"--flavour", "fsdp1", "--recipe", "hf"});
  CHECK(
      contains(llama1, "from transformers.models.llama.modeling_llama import LlamaDecoderLayer\n"));
  CHECK(contains(llama1, "auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),"));
  CHECK(!contains(llama1, "TransformerBlock"));
  const auto gpt2 = run("gpt2", {"--flavour", "fsdp1", "--recipe", "hf"});
  CHECK(contains(gpt2, "from transformers.models.gpt2.modeling_gpt2 import GPT2Block\n"));
  CHECK(contains(run("gpt2", {"--flavour", "fsdp2"}),
                 "for block in model.transformer.h.children():"));
  const auto titan = run("llama-3-8b", {"--recipe", "torchtitan", "--checkpointing", "full"});
  CHECK(contains(titan, "for name, block in list(model.layers.named_children()):"));
  CHECK(contains(titan, "for block in model.layers.children():"));
  const auto params = run("params:7e9", {"--flavour", "fsdp1"});
  CHECK(contains(params, "ModuleWrapPolicy({TransformerBlock}),  # TransformerBlock: your model's "
                         "block class"));
}
