#include <doctest/doctest.h>

#include <vector>

#include "costmodel/pipeline_schedule.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

PipelineWalk equal_stages(PipelineSchedule s, int p, int v, int m, double tf, double tb) {
  return walk_schedule(s, p, v, m, std::vector<double>(static_cast<std::size_t>(p), tf),
                       std::vector<double>(static_cast<std::size_t>(p), tb));
}

}  // namespace

// Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", §2.2.1): with equal stages, the bubble of GPipe and of 1F1B is (p − 1)·(tf + tb)
// over an ideal m·(tf + tb), i.e. (p − 1)/m; interleaving v chunks per stage divides it by v
// (§2.2.2). The walk only knows the op lists and their dependencies; the closed forms must come
// out.
TEST_CASE("pipeline_schedule::bubble fractions are the closed forms for equal stages") {
  for (double tb : {1.0, 2.0}) {  // backward = forward, and the usual backward = 2 x forward
    CHECK(equal_stages(PipelineSchedule::one_f_one_b, 4, 1, 8, 1, tb).bubble_fraction ==
          doctest::Approx(3.0 / 8));
    CHECK(equal_stages(PipelineSchedule::gpipe, 4, 1, 8, 1, tb).bubble_fraction ==
          doctest::Approx(3.0 / 8));
    CHECK(equal_stages(PipelineSchedule::one_f_one_b, 8, 1, 32, 1, tb).bubble_fraction ==
          doctest::Approx(7.0 / 32));
    CHECK(equal_stages(PipelineSchedule::interleaved_1f1b, 4, 2, 8, 1, tb).bubble_fraction ==
          doctest::Approx(3.0 / 16));
    CHECK(equal_stages(PipelineSchedule::interleaved_1f1b, 4, 3, 12, 1, tb).bubble_fraction ==
          doctest::Approx(3.0 / 36));
    CHECK(equal_stages(PipelineSchedule::interleaved_1f1b, 8, 4, 16, 1, tb).bubble_fraction ==
          doctest::Approx(7.0 / 64));
  }
  // One stage has no bubble; its span is m·(tf + tb).
  const auto one = equal_stages(PipelineSchedule::one_f_one_b, 1, 1, 5, 1, 2);
  CHECK(one.bubble_fraction == doctest::Approx(0));
  CHECK(one.span_s == doctest::Approx(15));
  // 1F1B's span with p = 4, m = 8, tf = 1, tb = 2: (m + p − 1)·(tf + tb) = 33.
  CHECK(equal_stages(PipelineSchedule::one_f_one_b, 4, 1, 8, 1, 2).span_s == doctest::Approx(33));
}

TEST_CASE("pipeline_schedule::a slow stage sets the pace and a p2p delay adds to each hop") {
  // Stage 1 of 2 twice as slow (tf 2, tb 4), m = 4, 1F1B: stage 1 works 4·6 = 24 s from when
  // stage 0's first forward arrives (t = 1) and never waits again (stage 0 always has the next
  // forward ready in time), then stage 0 runs the last backward (2 s): span 1 + 24 + 2 = 27 s,
  // bubble (27 − 24)/24 against the busiest stage.
  const auto w = walk_schedule(PipelineSchedule::one_f_one_b, 2, 1, 4, {1, 2}, {2, 4});
  CHECK(w.span_s == doctest::Approx(27));
  CHECK(w.bubble_fraction == doctest::Approx(3.0 / 24));
  CHECK(w.busy_s[0] == doctest::Approx(12));
  // A p2p of 0.5 s per crossing: 1F1B with p = 2, m = 1 runs F0, F1, B1, B0 in a chain with two
  // crossings: 1 + 0.5 + 1 + 2 + 0.5 + 2 = 7.
  CHECK(walk_schedule(PipelineSchedule::one_f_one_b, 2, 1, 1, {1, 1}, {2, 2}, 0.5).span_s ==
        doctest::Approx(7));
}

TEST_CASE("pipeline_schedule::micro-batches in flight per stage") {
  // 1F1B: stage s runs p − s − 1 warm-up forwards and one more before its first backward, so it
  // holds p − s micro-batches (p on the first stage); never more than m.
  const auto f = equal_stages(PipelineSchedule::one_f_one_b, 4, 1, 8, 1, 2);
  CHECK(f.peak_chunks == std::vector<int>{4, 3, 2, 1});
  CHECK(equal_stages(PipelineSchedule::one_f_one_b, 4, 1, 2, 1, 2).peak_chunks ==
        std::vector<int>{2, 2, 2, 1});
  // GPipe holds every micro-batch on every stage.
  CHECK(equal_stages(PipelineSchedule::gpipe, 4, 1, 8, 1, 2).peak_chunks ==
        std::vector<int>{8, 8, 8, 8});
  // Interleaved, counted by hand from Megatron's warm-up rule: stage s runs
  // 2·(p − s − 1) + (v − 1)·p warm-up forwards of one chunk each, then one more forward before its
  // first backward. p = 4, v = 2: stage 0 holds 6 + 4 + 1 = 11 chunks, stage 3 0 + 4 + 1 = 5.
  // In micro-batches of the whole stage (a chunk is 1/v of it): 11/2 = 5.5 on the first stage,
  // which is p·(1 + (p − 1)/(p·v)) = 4·(1 + 3/8) = 5.5 (Korthikanti et al. 2022, §4.2.3).
  const auto i = equal_stages(PipelineSchedule::interleaved_1f1b, 4, 2, 8, 1, 2);
  CHECK(i.peak_chunks == std::vector<int>{11, 9, 7, 5});
  CHECK(i.peak_in_flight[0] == doctest::Approx(5.5));
  // p = 8, v = 4: 2·7 + 3·8 + 1 = 39 chunks on stage 0 = 9.75 stage micro-batches = 8·(1 + 7/32).
  CHECK(equal_stages(PipelineSchedule::interleaved_1f1b, 8, 4, 16, 1, 2).peak_in_flight[0] ==
        doctest::Approx(9.75));
}

TEST_CASE("pipeline_schedule::op lists follow Megatron's order") {
  // Interleaved p = 2, v = 2, m = 4: the k-th forward works on chunk (k mod 4)/2 and micro-batch
  // (k/4)·2 + k mod 2: F(0,c0) F(1,c0) F(0,c1) F(1,c1) F(2,c0) ...; stage 0 warms up with
  // 2·1 + 1·2 = 4 forwards, then its first backward is micro-batch 0 of its last chunk.
  const auto ops = schedule_ops(PipelineSchedule::interleaved_1f1b, 2, 2, 4);
  REQUIRE(ops[0].size() == 16);
  CHECK(ops[0][2].micro_batch == 0);
  CHECK(ops[0][2].chunk == 1);
  CHECK(ops[0][4].micro_batch == 2);  // the fifth forward
  CHECK(ops[0][4].chunk == 0);
  CHECK(ops[0][5].kind == PipeOpKind::backward);
  CHECK(ops[0][5].micro_batch == 0);
  CHECK(ops[0][5].chunk == 1);
  CHECK_THROWS(schedule_ops(PipelineSchedule::interleaved_1f1b, 4, 2, 6));
}
