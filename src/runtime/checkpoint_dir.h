// The layout of a checkpoint save root on disk (Notes [Checkpoint layout], [Checkpoint commit]
// in checkpoint.h): the file names, iteration directory names, the `latest` pointer, what an
// interrupted save leaves behind, and retention. What the files hold is checkpoint.cc's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::runtime {

// The files of an iteration directory and of a save root (Note [Checkpoint layout]).
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kModelIndexFile = "model.safetensors.index.json";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateFile = "trainer_state.json";
inline constexpr const char* kLatestFile = "latest";

// `path` without trailing '/' (a lone "/" stays).
std::string strip_trailing_slashes(std::string path);
// Whether anything, a dangling link included, has that name.
bool path_exists(const std::string& path);

// "iter_0000042" (Megatron's directory names).
std::string iteration_dir_name(int64_t iteration);
// The iteration of an "iter_NNNNNNN" name (at least 7 digits), or -1 for any other name.
int64_t parse_iteration_name(const std::string& name);

// Removes what an interrupted save into `root` left (Note [Checkpoint commit]): directories and
// files of ours with a .tmp-/.old- suffix (io::recover_atomic_dir) and .deleted- directories.
void recover_save_root(const std::string& root);

// Keeps the iteration directory `written` and the `keep - 1` newest others of `root` (0: keeps
// all; Note [Checkpoint commit] says which are newest), deleting the rest: each renamed aside
// first, so its name never holds a partly deleted checkpoint. Appends the deleted directories to
// `removed` and a failed delete to `warnings` (the save stands).
void apply_retention(const std::string& root, int64_t written, int64_t keep,
                     std::vector<std::string>& removed, std::vector<std::string>& warnings);

// The directory that `dir` designates: a save root (with `latest`) resolves to the iteration
// directory `latest` names; an iteration or HF directory resolves to itself. Throws
// tandem::Error naming the path and what is missing or malformed.
std::string resolve_checkpoint_dir(const std::string& dir);

}  // namespace tandem::runtime
