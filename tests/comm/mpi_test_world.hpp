// The world communicator of the MPI test binary (made in its main, freed before MPI_Finalize).
#pragma once

#include "comm/mpi_communicator.hpp"

shardplan::comm::MpiCommunicator& test_world();
