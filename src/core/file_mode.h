// The permissions tandem's outputs are created with. The crash-safe writers create a file or a
// directory under a temporary name with mkstemp(3) or mkdtemp(3), which make it 0600 or 0700
// whatever the umask; they then give it the mode open(2) or mkdir(2) would have given it, so an
// output reads as any other file the user writes (0644 and 0755 under the usual umask 022).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdio>

namespace tandem {

// The process's umask, read once from /proc/self/status (reading it through umask(2) sets it for
// a moment, which a thread creating a file at that moment would see); umask(2) where /proc does
// not say.
inline mode_t process_umask() {
  static const mode_t mask = [] {
    unsigned value = 0;
    bool found = false;
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (!found && std::fgets(line, sizeof line, f) != nullptr) {
        found = std::sscanf(line, "Umask: %o", &value) == 1;
      }
      std::fclose(f);
    }
    if (found) return static_cast<mode_t>(value);
    const mode_t m = ::umask(022);
    ::umask(m);
    return m;
  }();
  return mask;
}

// The mode a new file (0666) or directory (0777) gets under the umask.
inline mode_t new_file_mode() { return 0666 & ~process_umask(); }
inline mode_t new_directory_mode() { return 0777 & ~process_umask(); }

}  // namespace tandem
