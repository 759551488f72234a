#include <doctest/doctest.h>

#include <string>

#include "comm/comm_error.hpp"
#include "comm/process_identity.hpp"

using namespace shardplan::comm;

TEST_CASE("comm_error::the message names what failed, host, rank, file and line") {
  set_process_rank(3);
  const CommError e("MPI_Allreduce failed: MPI_ERR_COUNT: invalid count argument",
                    "/any/where/comm/x.cpp", 42);
  const std::string what = e.what();
  CHECK(what == "MPI_Allreduce failed: MPI_ERR_COUNT: invalid count argument (host " + host_name() +
                    ", rank 3, comm/x.cpp:42)");
  CHECK(e.rank() == 3);
  CHECK(e.file() == "comm/x.cpp");
  CHECK(e.line() == 42);
  set_process_rank(-1);
  CHECK(std::string(CommError("x", "y.cpp", 1).what()).find("rank ?") != std::string::npos);
}
