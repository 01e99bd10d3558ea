// TensorBoard event files (tensorboard.h): records framed as Note [TensorBoard records] says,
// events serialized by the protobuf library from tensorboard_event.proto.
#include "io/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/checksum.h"
#include "tensorboard_event.pb.h"

namespace tandem::io {
namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8U;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// A new file in `dir` named after the time and host; the name gets a counter when it is taken
// (two writers in one second).
std::unique_ptr<FILE, int (*)(FILE*)> create_event_file(const std::string& dir, std::string& path) {
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", static_cast<long long>(now_seconds()));
  const std::string base = (std::filesystem::path(dir) /
                            ("events.out.tfevents." + std::string(stamp) + "." + host_name()))
                               .string();
  for (int n = 1;; ++n) {
    path = n == 1 ? base : base + "." + std::to_string(n);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST && n < 1000) continue;
    TANDEM_CHECK(fd >= 0, "--tensorboard-dir ", dir, ": cannot create ", path, " (",
                 std::strerror(errno), ")");
    return {::fdopen(fd, "wb"), &std::fclose};
  }
}

}  // namespace

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(0, bytes.data(), bytes.size());
  return ((c >> 15) | (c << 17)) + kMaskDelta;
}

std::string tensorboard_record(std::string_view data) {
  std::string out;
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) : file_(nullptr, &std::fclose) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TANDEM_CHECK(!ec && std::filesystem::is_directory(dir), "--tensorboard-dir ", dir,
               ": cannot create the directory (", ec ? ec.message() : "not a directory", ")");
  file_ = create_event_file(dir, path_);
  TANDEM_CHECK(file_ != nullptr, "--tensorboard-dir ", dir, ": cannot open ", path_, " (",
               std::strerror(errno), ")");
  tensorboard::Event first;
  first.set_wall_time(now_seconds());
  first.set_step(0);
  first.set_file_version("brain.Event:2");
  write_event(first.SerializeAsString());
  flush();
}

TensorBoardWriter::~TensorBoardWriter() = default;  // fclose writes what is buffered

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  tensorboard::ScalarValue* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_event(event.SerializeAsString());
}

void TensorBoardWriter::write_event(const std::string& data) {
  const std::string record = tensorboard_record(data);
  TANDEM_CHECK(std::fwrite(record.data(), 1, record.size(), file_.get()) == record.size(),
               "--tensorboard-dir: cannot write ", path_, " (", std::strerror(errno), ")");
}

void TensorBoardWriter::flush() {
  TANDEM_CHECK(std::fflush(file_.get()) == 0, "--tensorboard-dir: cannot write ", path_, " (",
               std::strerror(errno), ")");
}

}  // namespace tandem::io
