// Saving's folders: the step folder the parts go into, the index and its digest put in place of
// the previous pair, and the removal of the folders of older steps that this format wrote.
#include "executor/checkpoint_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/atomic_file.hpp"

namespace shardplan::executor::checkpoint_format {

// A step folder absent, or a folder of its own: a symbolic link there would send the parts
// elsewhere.
void check_step_folder(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw InputError(path.string(), fmt::format("cannot read: {}", errno_text()));
  }
  if (S_ISLNK(st.st_mode))
    throw InputError(path.string(), "a symbolic link: a checkpoint writes its parts only into "
                                    "folders of its own");
  if (!S_ISDIR(st.st_mode)) throw InputError(path.string(), "exists and is not a folder");
}

void make_step_folder(const fs::path& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  if (errno != EEXIST)
    throw InputError(path.string(), fmt::format("cannot make the folder: {}", errno_text()));
  check_step_folder(path);
}

// The index and its digest in `folder`: both written and synced under temporary names, then
// renamed, the index first, then the folder synced. A reader sees the previous pair or the new
// one; a save cut short between the two renames leaves the new index with the previous digest
// (read_index_in then takes the index for its step folder's copy, written before).
void write_index(const fs::path& folder, const std::string& text) {
  HashedFile index(folder / kIndex);
  index.write(text.data(), text.size());
  const std::string line = digest_line(index.sync());
  HashedFile digest(folder / kIndexDigest);
  digest.write(line.data(), line.size());
  digest.sync();
  index.commit(false);
  digest.commit();
}

namespace {

// A step folder this format wrote, open, and the names of the files its index names in it.
struct OwnStepFolder {
  Fd fd;
  std::vector<std::string> files;
};

// Step folder `name` of DIR (open as `dirfd`) when it is one this format wrote for a step before
// `step`: it holds a copy of the index (digest and all) of the step its name says, and that index
// names files directly in it. Nothing otherwise: a symbolic link, a newer step, a folder without
// a valid index.
std::optional<OwnStepFolder> older_step_folder(int dirfd, const fs::path& root,
                                               const std::string& name, std::int64_t step) {
  static const std::regex kStepDir("step-([0-9]{8,18})");
  std::smatch m;
  if (!std::regex_match(name, m, kStepDir)) return std::nullopt;
  const std::int64_t older = std::stoll(m[1].str());
  if (older >= step || name != step_folder(older)) return std::nullopt;
  OwnStepFolder folder{
      Fd(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)), {}};
  if (folder.fd.get() < 0) return std::nullopt;
  try {
    const auto index = read_index_in(folder.fd.get(), (root / name).string(), true);
    if (index.step != older) return std::nullopt;
    for (const auto& f : index.files) {
      const fs::path p(f.path);
      if (p.parent_path() != fs::path(name) || !p.has_filename()) return std::nullopt;
      folder.files.push_back(p.filename().string());
    }
  } catch (const InputError&) {
    return std::nullopt;
  }
  return folder;
}

// Removes a regular file (never what a symbolic link points to).
void remove_own_file(int dirfd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
    ::unlinkat(dirfd, name.c_str(), 0);
}

// The names in `folder` of the temporaries that a save cut short left for the files `own`
// (core::temporary_prefix).
std::vector<std::string> leftover_temporaries(const fs::path& folder,
                                              const std::vector<std::string>& own) {
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    for (const auto& name : own)
      if (entry.starts_with(core::temporary_prefix(name))) {
        found.push_back(entry);
        break;
      }
  }
  return found;
}

}  // namespace

// Once step `step`'s index is in place: the folders of older steps that this format wrote go,
// each with only the files its index names, then the index, then the folder if that left it
// empty (a user's notes in it stay, and so does the folder). Best effort: what stays does no
// harm.
void remove_older_steps(const fs::path& root, std::int64_t step) {
  const Fd dirfd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dirfd.get() < 0) return;
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  for (const auto& name : names) {
    const auto folder = older_step_folder(dirfd.get(), root, name, step);
    if (!folder) continue;
    std::vector<std::string> own = folder->files;
    own.insert(own.end(), {kIndex, kIndexDigest});
    for (const auto& f : leftover_temporaries(root / name, own))
      remove_own_file(folder->fd.get(), f);
    for (const auto& f : own) remove_own_file(folder->fd.get(), f);
    ::unlinkat(dirfd.get(), name.c_str(), AT_REMOVEDIR);  // fails, harmlessly, when not empty
  }
}

}  // namespace shardplan::executor::checkpoint_format
