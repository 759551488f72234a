#include "calibrate/staged_host_communicator.hpp"

#include "comm/host_buffer.hpp"

namespace shardplan::calibrate {
namespace {

std::size_t bytes_of(std::size_t count, comm::DataType type) {
  return count * comm::element_bytes(type);
}

}  // namespace

StagedHostCommunicator::StagedHostCommunicator(comm::Communicator& inner)
    : ForwardingCommunicator(inner) {}

StagedHostCommunicator::StagedHostCommunicator(std::unique_ptr<comm::Communicator> inner)
    : ForwardingCommunicator(*inner), owned_(std::move(inner)) {}

std::unique_ptr<comm::CommBuffer> StagedHostCommunicator::allocate(std::size_t bytes) {
  return std::make_unique<comm::HostBuffer>(bytes);
}

comm::CommBuffer& StagedHostCommunicator::send_stage(std::size_t bytes) {
  if (send_ == nullptr || send_->bytes() < bytes) send_ = inner_.allocate(bytes);
  return *send_;
}

comm::CommBuffer& StagedHostCommunicator::recv_stage(std::size_t bytes) {
  if (recv_ == nullptr || recv_->bytes() < bytes) recv_ = inner_.allocate(bytes);
  return *recv_;
}

// Each collective: the host input into the send stage, the collective on the stages, a wait for
// it (the inner communicator may only queue it), then the stage's result into host memory. The
// input is copied before anything is written back, so in-place calls (send == recv, or an
// all_gather whose send is its own block of recv) read their input intact.

void StagedHostCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count,
                                           comm::DataType type, comm::ReduceOp op) {
  const std::size_t bytes = bytes_of(count, type);
  auto& in = send_stage(bytes);
  auto& out = recv_stage(bytes);
  in.copy_from_host(send, bytes);
  inner_.all_reduce(in.data(), out.data(), count, type, op);
  inner_.synchronize();
  out.copy_to_host(recv, bytes);
}

void StagedHostCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                       comm::DataType type, int root, comm::ReduceOp op) {
  const std::size_t bytes = bytes_of(count, type);
  auto& in = send_stage(bytes);
  auto& out = recv_stage(bytes);
  in.copy_from_host(send, bytes);
  inner_.reduce(in.data(), out.data(), count, type, root, op);
  inner_.synchronize();
  if (rank() == root)  // recv is not touched on the other ranks
    out.copy_to_host(recv, bytes);
}

void StagedHostCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                        comm::DataType type) {
  const std::size_t block = bytes_of(count, type);
  const std::size_t total = block * static_cast<std::size_t>(size());
  auto& in = send_stage(block);
  auto& out = recv_stage(total);
  in.copy_from_host(send, block);
  inner_.all_gather(in.data(), out.data(), count, type);
  inner_.synchronize();
  out.copy_to_host(recv, total);
}

void StagedHostCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                               comm::DataType type, comm::ReduceOp op) {
  const std::size_t block = bytes_of(count, type);
  const std::size_t total = block * static_cast<std::size_t>(size());
  auto& in = send_stage(total);
  auto& out = recv_stage(block);
  in.copy_from_host(send, total);
  inner_.reduce_scatter(in.data(), out.data(), count, type, op);
  inner_.synchronize();
  out.copy_to_host(recv, block);
}

void StagedHostCommunicator::broadcast(void* buffer, std::size_t count, comm::DataType type,
                                       int root) {
  const std::size_t bytes = bytes_of(count, type);
  auto& stage = recv_stage(bytes);
  const bool is_root = rank() == root;
  if (is_root)  // the others' buffers are overwritten: their contents do not travel
    stage.copy_from_host(buffer, bytes);
  inner_.broadcast(stage.data(), count, type, root);
  inner_.synchronize();
  if (!is_root) stage.copy_to_host(buffer, bytes);
}

void StagedHostCommunicator::do_send(const void* buffer, std::size_t count, comm::DataType type,
                                     int peer) {
  const std::size_t bytes = bytes_of(count, type);
  auto& stage = send_stage(bytes);
  stage.copy_from_host(buffer, bytes);
  inner_.send(stage.data(), count, type, peer);
  inner_.synchronize();
}

void StagedHostCommunicator::do_recv(void* buffer, std::size_t count, comm::DataType type,
                                     int peer) {
  const std::size_t bytes = bytes_of(count, type);
  auto& stage = recv_stage(bytes);
  inner_.recv(stage.data(), count, type, peer);
  inner_.synchronize();
  stage.copy_to_host(buffer, bytes);
}

void StagedHostCommunicator::do_send_recv(const void* send_buffer, std::size_t send_count,
                                          int send_peer, void* recv_buffer, std::size_t recv_count,
                                          int recv_peer, comm::DataType type) {
  auto& out = send_stage(bytes_of(send_count, type));
  auto& in = recv_stage(bytes_of(recv_count, type));
  out.copy_from_host(send_buffer, bytes_of(send_count, type));
  inner_.send_recv(out.data(), send_count, send_peer, in.data(), recv_count, recv_peer, type);
  inner_.synchronize();
  in.copy_to_host(recv_buffer, bytes_of(recv_count, type));
}

void StagedHostCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                        comm::DataType type) {
  const std::size_t total = bytes_of(count, type) * static_cast<std::size_t>(size());
  auto& in = send_stage(total);
  auto& out = recv_stage(total);
  in.copy_from_host(send, total);
  inner_.all_to_all(in.data(), out.data(), count, type);
  inner_.synchronize();
  out.copy_to_host(recv, total);
}

std::unique_ptr<comm::Communicator> StagedHostCommunicator::split(int color, int key) {
  return std::make_unique<StagedHostCommunicator>(inner_.split(color, key));
}

}  // namespace shardplan::calibrate
