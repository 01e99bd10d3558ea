// Reading a small text input whole (a schedule, node times, routing tables): bounded, so that a
// path that never ends (/dev/zero, a pipe that keeps writing) or a file far larger than any such
// input is refused with a message instead of read until the host runs out of memory.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// The bound of the plan's inputs: far above any schedule, node times or routing a run makes.
constexpr int64_t kMaxTextInputBytes = int64_t{8} << 20;

// The whole of `path`, at most max_bytes. Throws tandem::Error naming `what` ("schedule file
// 's.txt'") when it cannot be opened or read (with the OS reason), is a directory, or holds more.
std::string read_text_input(const std::string& path, const std::string& what, int64_t max_bytes);

}  // namespace tandem
