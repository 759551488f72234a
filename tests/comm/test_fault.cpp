#include <doctest/doctest.h>

#include <string>

#include "comm/fault_injection.hpp"

using namespace shardplan::comm;

TEST_CASE("fault::parses each kind with its rank and step") {
  CHECK(parse_fault_injection("crash@1:3") == FaultInjection{FaultKind::crash, 1, 3});
  CHECK(parse_fault_injection("hang@0:1") == FaultInjection{FaultKind::hang, 0, 1});
  CHECK(parse_fault_injection("oom@12:40") == FaultInjection{FaultKind::oom, 12, 40});
  CHECK(parse_fault_injection("throw@3:2") == FaultInjection{FaultKind::exception, 3, 2});
  CHECK(std::string(fault_kind_name(FaultKind::exception)) == "throw");
}

TEST_CASE("fault::rejects anything but KIND@RANK:STEP") {
  for (const char* text : {"",
                           "x",
                           "crash",
                           "crash@",
                           "crash@1",
                           "crash@1:",
                           "crash@:2",
                           "@1:2",
                           "segv@1:2",
                           "Crash@1:2",
                           "crash@-1:2",
                           "crash@+1:2",
                           "crash@1:+2",
                           "crash@1:0",
                           "crash@1:-3",
                           "crash@1:2 ",
                           " crash@1:2",
                           "crash@1:2:3",
                           "crash@1@2",
                           "crash@1.5:2",
                           "crash@1:2x",
                           "crash@99999999999:2",
                           "crash@1:99999999999999999999",
                           "crash:1@2"}) {
    CAPTURE(text);
    CHECK_FALSE(parse_fault_injection(text).has_value());
  }
}
