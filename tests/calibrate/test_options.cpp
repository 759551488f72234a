#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "calibrate/options.hpp"
#include "core/input_error.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;

namespace {

CommandLine parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"calibrate"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

// The InputError's where() and message, or "no error".
std::string rejection(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("options::defaults of a measuring run") {
  const auto c = parse({});
  REQUIRE(c.command == CommandLine::Command::measure);
  const auto& m = c.measure;
  CHECK(m.backend == BackendKind::mpi);
  CHECK(m.ops == std::vector<documents::Collective>{documents::Collective::all_reduce,
                                                    documents::Collective::all_gather,
                                                    documents::Collective::reduce_scatter});
  CHECK(m.range.min_bytes == 8);
  CHECK(m.range.max_bytes == 8u << 20);
  CHECK(m.range.factor == 2);
  CHECK(m.warmup == 5);
  CHECK(m.iters == 20);
  CHECK(m.groups.empty());
  CHECK(m.check);
  CHECK(m.gemm);
  CHECK(m.gemm_model == "gpt2");
  CHECK(m.gemm_tokens == 256);
  CHECK(m.attention_seq == 0);  // no attention core timed
}

TEST_CASE("options::flags of a measuring run") {
  const auto m = parse({"--ops",       "all_to_all,broadcast,all_to_all",
                        "-b",          "1K",
                        "--max-bytes", "4M",
                        "-f",          "4",
                        "-w",          "0",
                        "-n",          "3",
                        "--groups",    "world,shard:2,replica:2,one_per_node",
                        "--no-check",  "--no-gemm",
                        "--into",      "p.json",
                        "--out",       "q.json"})
                     .measure;
  CHECK(m.ops == std::vector<documents::Collective>{documents::Collective::all_to_all,
                                                    documents::Collective::broadcast});
  CHECK(m.range.min_bytes == 1024);
  CHECK(m.range.max_bytes == 4u << 20);
  CHECK(m.range.factor == 4);
  CHECK(m.warmup == 0);
  CHECK(m.iters == 3);
  REQUIRE(m.groups.size() == 4);
  CHECK(m.groups[1] == comm::GroupSpec{comm::GroupKind::shard, 2});
  CHECK(m.groups[3] == comm::GroupSpec{comm::GroupKind::inter_node, 0});
  CHECK_FALSE(m.check);
  CHECK_FALSE(m.gemm);
  CHECK(m.into == "p.json");
  CHECK(m.out == "q.json");
}

TEST_CASE("options::--attention-seq times the model's core over whole sequences of --gemm-tokens") {
  const auto m =
      parse({"--gemm-model", "llama.json", "--gemm-tokens", "256", "--attention-seq", "128"})
          .measure;
  CHECK(m.gemm_model == "llama.json");
  CHECK(m.gemm_tokens == 256);
  CHECK(m.attention_seq == 128);
  CHECK(parse({"--gemm-model", "gpt2", "--attention-seq", "256"}).measure.attention_seq == 256);
  CHECK(parse({"--backend", "nccl", "--gemm-model", "gpt2", "--attention-seq", "1024"})
            .measure.attention_seq == 1024);  // of nccl's 4096 tokens
}

TEST_CASE("options::--attention-seq rejections name the flag and the value") {
  CHECK(rejection({"--gemm-model", "gpt2", "--attention-seq", "0"}) ==
        "--attention-seq: must be an integer between 1 and 1000000000, got \"0\"");
  CHECK(rejection({"--gemm-model", "gpt2", "--attention-seq", ""}) ==
        "--attention-seq: must be an integer between 1 and 1000000000, got \"\"");
  CHECK(rejection({"--gemm-model", "gpt2", "--attention-seq", "12x"}) ==
        "--attention-seq: must be an integer between 1 and 1000000000, got \"12x\"");
  CHECK(rejection({"--attention-seq", "128"}) ==
        "--attention-seq: 128 needs --gemm-model (the model whose attention is timed)");
  CHECK(rejection({"--gemm-model", "gpt2", "--gemm-tokens", "256", "--attention-seq", "100"}) ==
        "--attention-seq: 100 does not divide --gemm-tokens 256 (a micro-batch of whole "
        "sequences)");
  CHECK(rejection({"--gemm-model", "gpt2", "--attention-seq", "512"}) ==
        "--attention-seq: 512 does not divide --gemm-tokens 256 (a micro-batch of whole "
        "sequences)");  // more than the default tokens
}

TEST_CASE("options::rejections name the flag and the value") {
  CHECK(rejection({"--factor", "1"}) ==
        "--factor: must be an integer >= 2 (nccl-tests -f), got \"1\"");
  CHECK(rejection({"--factor", "1.5"}) ==
        "--factor: must be an integer >= 2 (nccl-tests -f), got \"1.5\"");
  CHECK(rejection({"--min-bytes", "64M", "--max-bytes", "1M"}) ==
        "--min-bytes: 64M is larger than --max-bytes 1M");
  CHECK(rejection({"--ops", "all_reduce,allreduce"})
            .rfind("--ops: unknown collective \"allreduce\" (known: all_reduce,", 0) == 0);
  CHECK(rejection({"--min-bytes", "12X"}) ==
        "--min-bytes: must be a byte count like 8, 64K, 32M or 1G, got \"12X\"");
  CHECK(rejection({"--max-bytes", "0"}) == "--max-bytes: must be > 0, got 0");
  CHECK(rejection({"--iters", "0"}) ==
        "--iters: must be an integer between 1 and 1000000, got \"0\"");
  CHECK(rejection({"--warmup", "-1"}) ==
        "--warmup: must be an integer between 0 and 1000000, got \"-1\"");
  CHECK(rejection({"--backend", "gloo"}) == "--backend: must be nccl or mpi, got \"gloo\"");
  CHECK(rejection({"--groups", "world,shard:0"}).rfind("--groups: unknown group \"shard:0\"", 0) ==
        0);
  CHECK(rejection({"--gemm-tokens", "x"}) ==
        "--gemm-tokens: must be an integer between 1 and 1000000000, got \"x\"");
  CHECK(rejection({"--bogus"}).rfind("command line: ", 0) == 0);
  CHECK(rejection({"import-nccl-tests"}).rfind("command line: ", 0) == 0);  // no LOG
  CHECK(rejection({"import", "a.log", "--tier", "rack"}) ==
        "--tier: must be intra_node or inter_node, got \"rack\"");
  CHECK(rejection({"import", "a.log", "--ranks", "0"}) ==
        "--ranks: must be an integer between 1 and 1000000, got \"0\"");
  CHECK(rejection({"import", "a.log", "--op", "gather"})
            .rfind("--op: unknown collective \"gather\"", 0) == 0);
}

TEST_CASE(
    "options::a zero or empty value is refused, not read as the default, integers are decimal") {
  CHECK(rejection({"--min-bytes", ""}) ==
        "--min-bytes: must be a byte count like 8, 64K, 32M or 1G, got \"\"");
  CHECK(rejection({"--max-bytes", ""}) ==
        "--max-bytes: must be a byte count like 8, 64K, 32M or 1G, got \"\"");
  CHECK(rejection({"--gemm-tokens", ""}) ==
        "--gemm-tokens: must be an integer between 1 and 1000000000, got \"\"");
  CHECK(rejection({"--gemm-tokens", "0"}) ==
        "--gemm-tokens: must be an integer between 1 and 1000000000, got \"0\"");
  CHECK(rejection({"--gemm-model", ""}) == "--gemm-model: must name a preset or a file, got \"\"");
  CHECK(rejection({"--groups", ""}).rfind("--groups: unknown group \"\"", 0) == 0);
  CHECK(rejection({"--out", ""}) == "--out: must name a file, got \"\"");
  CHECK(rejection({"--into", ""}) == "--into: must name a file, got \"\"");
  CHECK(rejection({"import", "a.log", "--ranks", ""}) ==
        "--ranks: must be an integer between 1 and 1000000, got \"\"");
  CHECK(rejection({"import", "a.log", "--tier", ""}) ==
        "--tier: must be intra_node or inter_node, got \"\"");
  CHECK(rejection({"import", "a.log", "--op", ""}).rfind("--op: unknown collective \"\"", 0) == 0);
  CHECK(rejection({"import", "a.log", "--out", ""}) == "--out: must name a file, got \"\"");
  // Decimal only, in range: never octal, hex or wrapped.
  CHECK(parse({"--iters", "010"}).measure.iters == 10);
  CHECK(parse({"import", "a.log", "--ranks", "010"}).import.ranks == 10);
  CHECK(rejection({"--iters", "0x10"}) ==
        "--iters: must be an integer between 1 and 1000000, got \"0x10\"");
  CHECK(rejection({"--iters", "4294967297"}) ==
        "--iters: must be an integer between 1 and 1000000, got \"4294967297\"");
  CHECK(rejection({"--min-bytes", "0x10"}) ==
        "--min-bytes: must be a byte count like 8, 64K, 32M or 1G, got \"0x10\"");
  CHECK(rejection({"--timeout-s", "0x1p3"}) ==
        "--timeout-s: must be a number of seconds > 0 and finite, got \"0x1p3\"");
}

TEST_CASE("options::the import command and help") {
  const auto c = parse({"import-nccl-tests", "a.log", "b.log", "--ranks", "16", "--tier",
                        "inter_node", "--op", "all_gather", "--into", "p.json", "--out", "q.json"});
  REQUIRE(c.command == CommandLine::Command::import_logs);
  CHECK(c.import.logs == std::vector<std::string>{"a.log", "b.log"});
  CHECK(c.import.ranks == 16);
  CHECK(c.import.tier == documents::Tier::inter_node);
  CHECK(c.import.op == documents::Collective::all_gather);
  CHECK(parse({"import", "x.log"}).command == CommandLine::Command::import_logs);
  const auto help = parse({"--help"});
  CHECK(help.command == CommandLine::Command::help);
  CHECK(help.help_text.find("--min-bytes") != std::string::npos);
  const auto import_help = parse({"import", "--help"});
  CHECK(import_help.help_text.find("--tier") != std::string::npos);
}

TEST_CASE("options::help names each value's kind, never CLI11's TEXT") {
  for (const auto& args :
       {std::vector<std::string>{"--help"}, std::vector<std::string>{"import", "--help"}}) {
    const std::string help = parse(args).help_text;
    CAPTURE(help);
    CHECK(help.find("TEXT") == std::string::npos);
    CHECK(help.find("--into PROFILE") != std::string::npos);
    CHECK(help.find("FILE") != std::string::npos);
  }
  const std::string help = parse({"--help"}).help_text;
  CHECK(help.find("--min-bytes BYTES") != std::string::npos);
  CHECK(help.find("--iters N") != std::string::npos);
  CHECK(help.find("--timeout-s SECONDS") != std::string::npos);
}

TEST_CASE("options::a backend this build lacks is bad input") {
  for (BackendKind backend : {BackendKind::mpi, BackendKind::nccl}) {
    if (backend_available(backend)) {
      CHECK_NOTHROW(require_backend(backend));
    } else {
      CHECK_THROWS_WITH_AS(require_backend(backend),
                           doctest::Contains("this calibrate was built without"), core::InputError);
    }
  }
}

TEST_CASE("fault::calibrate's --timeout-s and --inject-fault") {
  const auto m = parse({"--timeout-s", "2.5", "--inject-fault", "hang@1:4"}).measure;
  CHECK(m.timeout_s == 2.5);
  CHECK(m.fault == comm::FaultInjection{comm::FaultKind::hang, 1, 4});
  CHECK(parse({}).measure.timeout_s == 300);
  CHECK_FALSE(parse({}).measure.fault.has_value());
  CHECK(rejection({"--inject-fault", "x"}) ==
        "--inject-fault: expected crash|hang|oom|throw@RANK:STEP, got \"x\"");
  CHECK(rejection({"--inject-fault", ""}) ==
        "--inject-fault: expected crash|hang|oom|throw@RANK:STEP, got \"\"");
  CHECK(rejection({"--inject-fault", "crash@1:0"}) ==
        "--inject-fault: expected crash|hang|oom|throw@RANK:STEP, got \"crash@1:0\"");
  for (const char* bad : {"0", "-3", "inf", "nan", "1e999", "ten", "5s", ""}) {
    CAPTURE(bad);
    CHECK(rejection({"--timeout-s", bad}) ==
          std::string("--timeout-s: must be a number of seconds > 0 and finite, got \"") + bad +
              "\"");
  }
}

TEST_CASE("options::--gpu-memory-GiB sets the new profile's device memory") {
  // 0.06 GiB = 0.06 × 2^30 bytes = 64424509.44 B.
  CHECK(*parse({"--gpu-memory-GiB", "0.06"}).measure.device_memory_bytes == 0.06 * 1073741824.0);
  CHECK_FALSE(parse({}).measure.device_memory_bytes.has_value());
  for (const char* bad : {"0", "-1", "inf", "nan", "big", ""}) {
    CAPTURE(bad);
    CHECK(rejection({"--gpu-memory-GiB", bad}) ==
          std::string("--gpu-memory-GiB: must be a number of GiB > 0 and finite, got \"") + bad +
              "\"");
  }
  // The old spelling is refused, naming the new one (planner's name for the same size).
  CHECK(rejection({"--device-memory-GiB", "1"}) ==
        "--device-memory-GiB: renamed: give --gpu-memory-GiB");
  CHECK(rejection({"--gpu-memory-GiB", "1", "--into", "p.json"}) ==
        "--gpu-memory-GiB: sets a new profile's memory; --into p.json keeps its own "
        "gpu.memory_GiB");
}
