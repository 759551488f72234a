// The stream-order checker (executor/stream_order.hpp) alone, then the sharding engine under it
// (executor/stream_check.hpp): every strategy and flavour, gradient accumulation 1 and 2, HSDP
// with replicas, prefetch as planned or not, both checkpointing modes, fp32 and the mixed
// precisions, every rank of 1 to 4 (each played in this process with stand-in collectives, each
// group a stream of its own as on a GPU). The engine's ordering must hold in every one.
#include <doctest/doctest.h>

#include <string>

#include <fmt/format.h>

#include "engine_fixture.hpp"
#include "executor/stream_check.hpp"
#include "executor/stream_order.hpp"

using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using shardplan::documents::Flavour;
using shardplan::documents::Precision;

namespace {

std::string all(const StreamOrderChecker& c) {
  std::string s;
  for (const auto& f : c.findings()) s += f + "\n";
  return s;
}

// Two streams and a block of 64 bytes allocated on the first.
struct Streams {
  StreamOrderChecker c;
  int compute = 0, reduce = 0;  // their addresses are the streams' identities
  alignas(64) char block[64] = {};
  Streams() {
    c.name_stream(&compute, "compute");
    c.name_stream(&reduce, "reduce");
    c.allocated(block, 64, &compute, "gradient");
  }
};

}  // namespace

TEST_CASE("stream_order::a write another stream did not wait for is a race") {
  Streams s;
  s.c.write(&s.compute, s.block, 64, "backward");
  s.c.read(&s.reduce, s.block, 64, "all-reduce");
  REQUIRE(s.c.finding_count() == 1);
  CHECK(s.c.findings()[0].find("all-reduce on reduce") != std::string::npos);
  CHECK(s.c.findings()[0].find("backward on compute") != std::string::npos);
}

TEST_CASE("stream_order::a wait orders what follows it, not what precedes it") {
  Streams s;
  s.c.write(&s.compute, s.block, 32, "backward");
  s.c.wait(&s.reduce, &s.compute);
  s.c.read(&s.reduce, s.block, 32, "all-reduce");  // after the wait: ordered
  s.c.write(&s.compute, s.block + 32, 32, "backward");
  s.c.read(&s.reduce, s.block + 32, 32, "all-reduce");  // written after the wait: a race
  CHECK(s.c.finding_count() == 1);
  // Reads on two streams never conflict; the write back without a wait does.
  s.c.read(&s.compute, s.block, 32, "copy");
  CHECK(s.c.finding_count() == 1);
  s.c.write(&s.compute, s.block, 32, "copy back");
  CHECK(s.c.finding_count() == 2);
}

TEST_CASE("stream_order::disjoint ranges of one block do not conflict") {
  Streams s;
  s.c.write(&s.compute, s.block, 32, "copy into bucket");
  s.c.wait(&s.reduce, &s.compute);
  s.c.write(&s.reduce, s.block, 32, "all-reduce");
  s.c.write(&s.compute, s.block + 32, 32, "copy into bucket");  // the other half
  CHECK(s.c.finding_count() == 0);
}

TEST_CASE("stream_order::waits are transitive and the host orders what it queues after a sync") {
  Streams s;
  int replica = 0;
  s.c.write(&s.compute, s.block, 64, "backward");
  s.c.wait(&s.reduce, &s.compute);
  s.c.wait(&replica, &s.reduce);
  s.c.read(&replica, s.block, 64, "all-reduce");
  CHECK(s.c.finding_count() == 0);
  s.c.write(&replica, s.block, 64, "all-reduce");
  s.c.host_waits(&replica);
  s.c.read(&s.compute, s.block, 64, "optimizer step");  // queued after the host waited
  CHECK(s.c.finding_count() == 0);
}

TEST_CASE("stream_order::a free fences the streams that used the block, and only those") {
  SUBCASE("record_use missing") {
    Streams s;
    s.c.wait(&s.reduce, &s.compute);
    s.c.read(&s.reduce, s.block, 64, "reduce-scatter");
    s.c.freed(s.block);
    REQUIRE(s.c.finding_count() == 1);
    CHECK(s.c.findings()[0].find("record_use is missing") != std::string::npos);
  }
  SUBCASE("record_use given") {
    Streams s;
    s.c.wait(&s.reduce, &s.compute);
    s.c.read(&s.reduce, s.block, 64, "reduce-scatter");
    s.c.record_use(s.block, &s.reduce);
    s.c.freed(s.block);
    CHECK(s.c.finding_count() == 0);
  }
  SUBCASE("an access after the free") {
    Streams s;
    s.c.freed(s.block);
    s.c.read(&s.compute, s.block + 8, 8, "copy");
    REQUIRE(s.c.finding_count() == 1);
    CHECK(s.c.findings()[0].find("after it was freed") != std::string::npos);
  }
  SUBCASE("another stream must wait for the allocation") {
    Streams s;
    s.c.write(&s.reduce, s.block, 64, "reduce-scatter");
    REQUIRE(s.c.finding_count() == 1);
    CHECK(s.c.findings()[0].find("allocation on compute") != std::string::npos);
  }
}

namespace {

// One rank of `world` under the checker: stand-in collectives, each group its own stream (the
// reductions on a stream of their own beside the all-gathers when separate_reduce, as on a GPU).
struct CheckedRun {
  std::string findings;
  std::int64_t count = 0, accesses = 0;
};

template <class S>
CheckedRun run_checked(EngineOptions o, int rank, int world, bool separate_reduce, int steps) {
  StreamOrderChecker checker;
  CheckedRun out;
  {
    CheckedMemory memory(checker);
    TrackedAllocator allocator(TrackedAllocator::kUnlimited, &memory);
    HostBackend<S> host;
    CheckedBackend<S> backend(host, checker, memory);
    if constexpr (std::is_same_v<S, float>)
      o.backend = &backend;
    else if constexpr (std::is_same_v<S, bf16>)
      o.backend_bf16 = &backend;
    else
      o.backend_f16 = &backend;
    const int G = o.spec.group(world);
    StandInCommunicator w(rank, world), shard(rank % G, G), replica(rank / G, world / G),
        shard_reduce(rank % G, G);
    CheckedCommunicator cw(w, checker, "world"), cs(shard, checker, "shard"),
        cr(replica, checker, "replica"), csr(shard_reduce, checker, "reduce");
    EngineGroups groups{&cw, &cs, world > G ? &cr : nullptr, true,
                        separate_reduce ? &csr : nullptr};
    ShardingEngine engine(o, allocator, groups);
    for (int k = 0; k < steps; ++k) (void)engine.step();
  }
  out.findings = all(checker);
  out.count = checker.finding_count();
  out.accesses = checker.accesses_checked();
  return out;
}

CheckedRun run_checked(const EngineOptions& o, int rank, int world, bool separate_reduce,
                       int steps = 2) {
  switch (o.precision) {
  case Precision::bf16_mixed:
    return run_checked<bf16>(o, rank, world, separate_reduce, steps);
  case Precision::fp16_mixed:
    return run_checked<f16>(o, rank, world, separate_reduce, steps);
  default:
    return run_checked<float>(o, rank, world, separate_reduce, steps);
  }
}

}  // namespace

// The two races a review of the engine found (each failed here before its fix).
TEST_CASE("stream_order::DDP copies the all-reduced buckets back only after the all-reduce") {
  // grad_bucket_copy is the default DDP spec: the compute stream copied the bucket back into the
  // gradients while the in-place all-reduce could still run on the reduce stream.
  auto spec = test_spec("ddp", Flavour::ddp, 2);
  REQUIRE(spec.grad_bucket_copy);
  const auto r = run_checked(test_options(small_llama(), spec, 1), 0, 2, true);
  CHECK_MESSAGE(r.count == 0, r.findings);
  CHECK(r.accesses > 0);
}

TEST_CASE("stream_order::HSDP's other replicas reduce into the kept chunk after its replica "
          "all-reduce") {
  // Rank 2 of 4 with shard groups of 2 is replica 1: it returned before the waits, so micro-batch
  // 2's reduce-scatter into the kept chunk was not ordered after micro-batch 1's all-reduce of it.
  auto spec = test_spec("hsdp", Flavour::fsdp2, 4);
  REQUIRE(spec.group(4) == 2);
  const auto r = run_checked(test_options(small_llama(), spec, 2), 2, 4, true);
  CHECK_MESSAGE(r.count == 0, r.findings);
}

TEST_CASE("stream_order::every strategy, flavour, rank and option of the engine is ordered") {
  struct Variant {
    std::int64_t gas;
    bool prefetch;
    Checkpointing ckpt;
    bool separate_reduce;
  };
  const Variant variants[] = {{1, false, Checkpointing::none, true},
                              {2, true, Checkpointing::none, true},
                              {2, true, Checkpointing::full, false},
                              {1, true, Checkpointing::full, true}};
  int runs = 0;
  for (const auto& st : kStrategies)
    for (int world : {1, 2, 3, 4}) {
      if (std::string(st.name) == "hsdp" && world < 4)
        continue;  // replicas need 4 ranks in shard groups of 2
      const auto spec = test_spec(st.name, st.flavour, world);
      for (int rank = 0; rank < world; ++rank)
        for (const auto& v : variants) {
          auto o = test_options(small_llama(), spec, v.gas, v.ckpt);
          o.prefetch_as_planned = v.prefetch;
          const auto r = run_checked(o, rank, world, v.separate_reduce);
          ++runs;
          CHECK_MESSAGE(r.count == 0,
                        fmt::format("{} {} rank {} of {}, {} micro-batches, "
                                    "prefetch {}, checkpointing {}:\n{}",
                                    st.name, flavour_name(st.flavour), rank, world, v.gas,
                                    v.prefetch, v.ckpt == Checkpointing::full, r.findings));
        }
    }
  CHECK(runs > 100);
}

TEST_CASE("stream_order::deeper prefetch and more gathers in flight are ordered too") {
  // The frameworks' defaults prefetch one unit with two all-gathers in flight; FSDP and DeepSpeed
  // let users go further (forward_prefetch, backward_prefetch, the limiter).
  for (const auto& st : kStrategies) {
    if (std::string(st.name) != "fsdp-full" && std::string(st.name) != "zero3" &&
        std::string(st.name) != "hsdp")
      continue;
    for (int depth : {2, 3})
      for (int inflight : {1, 4}) {
        auto spec = test_spec(st.name, st.flavour, 4);
        spec.forward_prefetch = spec.backward_prefetch = depth;
        spec.max_inflight_allgathers = inflight;
        spec.prefetch_bucket_elems = 0;  // DeepSpeed: the depth as given, not from its bucket
        auto o = test_options(small_llama(), spec, 2);
        o.prefetch_as_planned = true;
        for (int rank : {0, 3}) {
          const auto r = run_checked(o, rank, 4, true);
          CHECK_MESSAGE(r.count == 0,
                        fmt::format("{} {} depth {} in flight {} rank {}:\n{}", st.name,
                                    flavour_name(st.flavour), depth, inflight, rank, r.findings));
        }
      }
  }
}

TEST_CASE("stream_order::mixed precision and a tied head are ordered too") {
  for (auto precision : {Precision::bf16_mixed, Precision::fp16_mixed})
    for (const auto& st : kStrategies)
      for (int world : {2, 4}) {
        if (std::string(st.name) == "hsdp" && world < 4) continue;
        const auto spec = test_spec(st.name, st.flavour, world);
        for (const auto& model : {small_llama(), tiny_gpt2()}) {
          auto o = test_options(model, spec, 2);
          o.precision = precision;
          o.prefetch_as_planned = true;
          EngineOptions checked = o;
          bool runs = true;
          try {
            (void)precision_policy(precision, spec);
          } catch (const std::invalid_argument&) {
            runs = false;  // what the engine does not run (test_engine_mixed.cpp)
          }
          if (!runs) continue;
          const int rank = world - 1;
          const auto r = run_checked(checked, rank, world, true);
          CHECK_MESSAGE(r.count == 0,
                        fmt::format("{} {} {} {} rank {} of {}:\n{}", st.name,
                                    flavour_name(st.flavour), precision_name(precision), model.name,
                                    rank, world, r.findings));
        }
      }
}
