// The lock of a checkpoint folder: one executor at a time writes DIR. The rank that writes DIR's
// index holds flock(2) on DIR/.lock from before its first step to the end of its run, and writes
// its process id and host name into the file, so that a second executor saving into DIR is
// refused naming them. The lock goes with the process (the kernel releases it when the process
// ends, killed or not); the file stays. flock locks belong to an open file description: a second
// take in the same process conflicts too.
#pragma once

#include <string>

namespace shardplan::executor {

class CheckpointLock {
public:
  CheckpointLock() = default;  // holds nothing
  CheckpointLock(CheckpointLock&& o) noexcept;
  CheckpointLock& operator=(CheckpointLock&& o) noexcept;
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  ~CheckpointLock();

  // Makes DIR (and the folders above it) when missing and takes its lock. An InputError naming
  // --save when DIR cannot be made or written in, or when another process holds the lock
  // ("DIR is being written by pid N on host H").
  static CheckpointLock take(const std::string& dir);

private:
  explicit CheckpointLock(int fd) : fd_(fd) {}
  int fd_ = -1;  // DIR/.lock, locked
};

}  // namespace shardplan::executor
