// A regular file written whole or not at all, the one way every program replaces a file: the
// bytes go to a new temporary in the same folder, ".NAME.tmp-PID-RANDOM" (created O_EXCL and
// O_NOFOLLOW, so unique to the process and the call and never a link written through), which is
// fsynced, closed and renamed over NAME, and the folder is fsynced so that the rename reaches the
// disk. The rename replaces NAME itself, never what a symbolic link NAME points to. Until commit()
// has renamed it, the temporary is removed when the object goes (an error, an exception).
// Errors are core::InputError with errno's text: "PATH: cannot write: No space left on
// device", or with a flag given "--out: cannot write \"PATH\": No space left on device".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shardplan::core {

// Throws the InputError of a failed write of `path` (named by `flag` when there is one).
// strerror(errno): why the last system call on a file failed, for the lines above.
std::string errno_text();
[[noreturn]] void cannot_write(const std::string& path, const std::string& flag,
                               const std::string& reason);

class AtomicFile {
public:
  // Creates the temporary beside `path`. keep_mode: the permission bits the file gets (an
  // existing file's), or -1 for a new file's (0666 less the umask).
  explicit AtomicFile(std::string path, std::string flag = {}, int keep_mode = -1);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends bytes to the temporary.
  void write(const void* data, std::size_t bytes);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // The bytes on the disk under the temporary name, the temporary closed: after this only the
  // rename is left, which needs no space. Called by commit() when it has not been.
  void sync();
  // Synced, renamed over the path, and (sync_folder) the folder synced; a caller that renames
  // several files into one folder syncs it once, with the last.
  void commit(bool sync_folder = true);

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return temporary_; }

private:
  std::string path_;
  std::string flag_;
  std::string folder_;
  std::string temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// The start of the names AtomicFile gives the temporaries of a file named `name` (no folder): a
// temporary left by a process that was killed starts with it.
std::string temporary_prefix(std::string_view name);

// Fsyncs a folder, so that the renames into it reach the disk. A file system without fsync
// (EINVAL) and a folder that cannot be read (EACCES) are not errors: the file is in place. Throws
// as AtomicFile, naming `path` (the file renamed into it).
void sync_folder(const std::string& folder, const std::string& path, const std::string& flag = {});

}  // namespace shardplan::core
