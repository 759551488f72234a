// Writing an output file (SECURITY.md). By what the path is:
//   "-"                       standard output (std::cout), flushed and checked;
//   a character device, FIFO  written through: opened for writing, never created, truncated,
//   or socket                 replaced or renamed over (/dev/null stays a device);
//   a symbolic link           followed only to a device, FIFO or socket (/dev/stdout); a link to a
//                             regular file, a directory or nothing is refused (the link and its
//                             target are left as they are);
//   a regular file, or        written whole or not at all (core/atomic_file.hpp): a temporary
//   nothing yet               ".NAME.tmp-PID-RANDOM" beside it (created O_EXCL: unique to the
//                             process and the call), fsynced, closed and renamed over NAME, the
//                             folder fsynced (an existing file's permission bits are kept); on
//                             any failure the temporary is removed;
//   a directory or a block    refused.
//   device
// Every write and the close are checked. Errors are core::InputError with errno's text:
// "PATH: cannot write: No space left on device", or with a flag given
// "--out: cannot write \"PATH\": No such file or directory".
#pragma once

#include <string>
#include <string_view>

namespace shardplan::core {

void write_file(const std::string& path, std::string_view bytes, const std::string& flag = {});

// Whether write_file(path) can succeed, before the work that computes its bytes: the path is not a
// directory, a block device or a refused link, and a regular file's folder exists and takes a new
// file (one is created and removed there; the final file is not created). Throws as write_file.
void check_destination(const std::string& path, const std::string& flag = {});

}  // namespace shardplan::core
