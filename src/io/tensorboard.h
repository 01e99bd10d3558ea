// TensorBoard event files: scalars by tag and step, in the file format TensorBoard reads.
//
// Note [TensorBoard records]: an event file is a sequence of records, each
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (little-endian), where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 and data is a
// serialized event message (tensorboard_event.proto: wall_time 1, step 2, file_version 3,
// summary 5; a summary's values 1, a value's tag 1 and simple_value 2). The first event of a
// file carries file_version "brain.Event:2" and no summary. TensorBoard reads every file named
// events.out.tfevents.* in a directory, so a run restarted into the same directory adds a file
// beside the old one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace tandem::io {

// Note [TensorBoard records]'s mask of a CRC-32C.
uint32_t masked_crc32c(std::string_view bytes);

// One record around `data` (Note [TensorBoard records]).
std::string tensorboard_record(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` and its missing parents, then the file events.out.tfevents.<seconds since the
  // epoch, 10 digits>.<host name> in it (".2", ".3", ... appended when that name exists), and
  // writes the first event. Throws tandem::Error naming the path and the OS reason.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step`, now, holding one scalar (stored as float, as TensorBoard stores them).
  void add_scalar(const std::string& tag, double value, int64_t step);
  // Hands what was written to the operating system, so TensorBoard sees it while the run goes
  // on. Throws tandem::Error naming the file when a write failed.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& data);

  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
};

}  // namespace tandem::io
