#include "comm/mpi_communicator.hpp"

#include <array>
#include <climits>
#include <cstdint>
#include <mutex>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/host_buffer.hpp"
#include "core/half_float.hpp"

namespace shardplan::comm {
namespace {

int checked_count(std::size_t count, const char* call) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw CommError(fmt::format("{}: count {} exceeds MPI's int counts ({})", call, count, INT_MAX),
                    __FILE__, __LINE__);
  return static_cast<int>(count);
}

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
  case DataType::f32:
    return MPI_FLOAT;
  case DataType::f64:
    return MPI_DOUBLE;
  case DataType::bf16:  // raw 16-bit words; reduced by half_precision_op()
  case DataType::f16:
    return MPI_UINT16_T;
  case DataType::i32:
    return MPI_INT32_T;
  case DataType::i64:
    return MPI_INT64_T;
  case DataType::u8:
    return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

// Element-wise inout[i] = op(in[i], inout[i]) on 16-bit floats, computed in float and rounded back.
template <bool is_bf16, ReduceOp op>
void reduce_half_words(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = is_bf16 ? core::bf16_to_float(a[i]) : core::f16_to_float(a[i]);
    const float y = is_bf16 ? core::bf16_to_float(b[i]) : core::f16_to_float(b[i]);
    float r = x + y;
    if constexpr (op == ReduceOp::max) r = x > y ? x : y;
    if constexpr (op == ReduceOp::min) r = x < y ? x : y;
    b[i] = is_bf16 ? core::float_to_bf16(r) : core::float_to_f16(r);
  }
}

// The six user-defined operators, created once after MPI_Init and kept until exit.
MPI_Op half_precision_op(DataType type, ReduceOp op) {
  static std::once_flag created;
  static std::array<MPI_Op, 6> ops{};
  std::call_once(created, [] {
    const std::array<MPI_User_function*, 6> functions = {
        reduce_half_words<true, ReduceOp::sum>,  reduce_half_words<true, ReduceOp::max>,
        reduce_half_words<true, ReduceOp::min>,  reduce_half_words<false, ReduceOp::sum>,
        reduce_half_words<false, ReduceOp::max>, reduce_half_words<false, ReduceOp::min>};
    for (std::size_t i = 0; i < ops.size(); ++i)
      SHARDPLAN_MPI_CALL(MPI_Op_create, functions[i], 1, &ops[i]);
  });
  return ops[(type == DataType::bf16 ? 0u : 3u) + static_cast<std::size_t>(op)];
}

MPI_Op mpi_op(DataType type, ReduceOp op) {
  if (type == DataType::bf16 || type == DataType::f16) return half_precision_op(type, op);
  switch (op) {
  case ReduceOp::sum:
    return MPI_SUM;
  case ReduceOp::max:
    return MPI_MAX;
  case ReduceOp::min:
    return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) length = 0;
  throw CommError(fmt::format("{} failed: {}", call,
                              length > 0
                                  ? std::string(text.data(), static_cast<std::size_t>(length))
                                  : fmt::format("MPI error code {}", code)),
                  file, line);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  SHARDPLAN_MPI_CALL(MPI_Comm_set_errhandler, comm_, MPI_ERRORS_RETURN);
  SHARDPLAN_MPI_CALL(MPI_Comm_rank, comm_, &rank_);
  SHARDPLAN_MPI_CALL(MPI_Comm_size, comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF)
    MPI_Comm_free(&comm_);  // a destructor cannot report a failure; the job is ending anyway
}

std::string MpiCommunicator::library_version() const {
  std::array<char, MPI_MAX_LIBRARY_VERSION_STRING> text{};
  int length = 0;
  SHARDPLAN_MPI_CALL(MPI_Get_library_version, text.data(), &length);
  std::string version(text.data(), static_cast<std::size_t>(length));
  // "Open MPI v4.1.4, package: ..., ident: ..." -> "Open MPI v4.1.4"
  const auto end = version.find_first_of(",\n");
  if (end != std::string::npos) version.resize(end);
  return version;
}

std::unique_ptr<CommBuffer> MpiCommunicator::allocate(std::size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

void MpiCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                    ReduceOp op) {
  const int n = checked_count(count, "MPI_Allreduce");
  const void* source = send == recv ? MPI_IN_PLACE : send;
  SHARDPLAN_MPI_CALL(MPI_Allreduce, source, recv, n, mpi_type(type), mpi_op(type, op), comm_);
}

void MpiCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                int root, ReduceOp op) {
  const int n = checked_count(count, "MPI_Reduce");
  const void* source = (rank_ == root && send == recv) ? MPI_IN_PLACE : send;
  SHARDPLAN_MPI_CALL(MPI_Reduce, source, recv, n, mpi_type(type), mpi_op(type, op), root, comm_);
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::size_t count, DataType type) {
  const int n = checked_count(count, "MPI_Allgather");
  const auto* own_block = static_cast<const std::byte*>(recv) +
                          static_cast<std::size_t>(rank_) * count * element_bytes(type);
  if (send == own_block) {
    SHARDPLAN_MPI_CALL(MPI_Allgather, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpi_type(type),
                       comm_);
  } else {
    SHARDPLAN_MPI_CALL(MPI_Allgather, send, n, mpi_type(type), recv, n, mpi_type(type), comm_);
  }
}

void MpiCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                        DataType type, ReduceOp op) {
  const int n = checked_count(count, "MPI_Reduce_scatter_block");
  SHARDPLAN_MPI_CALL(MPI_Reduce_scatter_block, send, recv, n, mpi_type(type), mpi_op(type, op),
                     comm_);
}

void MpiCommunicator::broadcast(void* buffer, std::size_t count, DataType type, int root) {
  const int n = checked_count(count, "MPI_Bcast");
  SHARDPLAN_MPI_CALL(MPI_Bcast, buffer, n, mpi_type(type), root, comm_);
}

void MpiCommunicator::all_to_all(const void* send, void* recv, std::size_t count, DataType type) {
  const int n = checked_count(count, "MPI_Alltoall");
  SHARDPLAN_MPI_CALL(MPI_Alltoall, send, n, mpi_type(type), recv, n, mpi_type(type), comm_);
}

// Tag 0 for every message: MPI keeps messages between two ranks on one communicator and tag in
// order (MPI 4.0 §3.5, "Order"), which is all point-to-point users here rely on.
void MpiCommunicator::do_send(const void* buffer, std::size_t count, DataType type, int peer) {
  const int n = checked_count(count, "MPI_Send");
  SHARDPLAN_MPI_CALL(MPI_Send, buffer, n, mpi_type(type), peer, 0, comm_);
}

void MpiCommunicator::do_recv(void* buffer, std::size_t count, DataType type, int peer) {
  const int n = checked_count(count, "MPI_Recv");
  MPI_Status status{};
  SHARDPLAN_MPI_CALL(MPI_Recv, buffer, n, mpi_type(type), peer, 0, comm_, &status);
  int received = 0;
  SHARDPLAN_MPI_CALL(MPI_Get_count, &status, mpi_type(type), &received);
  if (received != n)
    throw CommError(
        fmt::format("MPI_Recv: {} elements from rank {}, expected {}", received, peer, n), __FILE__,
        __LINE__);
}

void MpiCommunicator::do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                                   void* recv_buffer, std::size_t recv_count, int recv_peer,
                                   DataType type) {
  const int s = checked_count(send_count, "MPI_Sendrecv");
  const int r = checked_count(recv_count, "MPI_Sendrecv");
  MPI_Status status{};
  SHARDPLAN_MPI_CALL(MPI_Sendrecv, send_buffer, s, mpi_type(type), send_peer, 0, recv_buffer, r,
                     mpi_type(type), recv_peer, 0, comm_, &status);
  int received = 0;
  SHARDPLAN_MPI_CALL(MPI_Get_count, &status, mpi_type(type), &received);
  if (received != r)
    throw CommError(
        fmt::format("MPI_Sendrecv: {} elements from rank {}, expected {}", received, recv_peer, r),
        __FILE__, __LINE__);
}

void MpiCommunicator::barrier() { SHARDPLAN_MPI_CALL(MPI_Barrier, comm_); }

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_mpi(int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  SHARDPLAN_MPI_CALL(MPI_Comm_split, comm_, color, key, &part);
  return std::make_unique<MpiCommunicator>(part);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  return split_mpi(color, key);
}

}  // namespace shardplan::comm
