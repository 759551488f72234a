// The MPI world of the executor's MPI tests (a private duplicate of MPI_COMM_WORLD).
#pragma once

#include "comm/communicator.hpp"

shardplan::comm::Communicator& test_world();
