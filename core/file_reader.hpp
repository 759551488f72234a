// Reading an input file whole, within a bound: only a regular file is read (a symbolic link is
// followed, and its target must be one); a directory, FIFO, socket or device (/dev/zero) is
// refused at once, without reading or waiting for a writer (the file is opened O_NONBLOCK and its
// type taken from the open descriptor). A file larger than the bound is refused before it is read.
#pragma once

#include <cstdint>
#include <string>

namespace shardplan::core {

// The bound of a JSON document (a model, hardware profile, job, plan, run or checkpoint index).
inline constexpr std::int64_t kDocumentBytes = std::int64_t{16} << 20;  // 16 MiB

// The file's bytes. Throws core::InputError at the path (printable(path)) with the reason:
// "cannot open file: No such file or directory", "is a directory, not a regular file", "is
// 209715200 bytes, more than the 16 MiB (16777216 bytes) this file may have", ...
std::string read_file(const std::string& path, std::int64_t limit_bytes = kDocumentBytes);

}  // namespace shardplan::core
