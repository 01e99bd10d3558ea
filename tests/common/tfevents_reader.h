// A reader of TensorBoard event files for the tests, written from the format alone and sharing
// nothing with the writer (src/io/tensorboard.cc): its own bit-by-bit CRC-32C, its own decoding
// of the protobuf wire format (varints, fixed 32 and 64 bits, length-delimited fields), and the
// field numbers of TensorBoard's Event, Summary and Summary.Value messages. Every length and
// both checksums of every record are checked; a broken file throws std::runtime_error.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::testing {

struct TfScalar {
  std::string tag;
  std::optional<float> value;  // simple_value, absent when the value was not written
};

struct TfEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::optional<std::string> file_version;
  std::vector<TfScalar> scalars;  // the summary's values
};

// CRC-32C (Castagnoli, reflected 0x82f63b78), one bit at a time.
inline uint32_t tf_crc32c(std::string_view bytes) {
  uint32_t crc = 0xffffffffU;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78U & (0U - (crc & 1U)));
  }
  return ~crc;
}

inline uint32_t tf_masked_crc(std::string_view bytes) {
  const uint32_t c = tf_crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8U;
}

// A cursor over protobuf wire-format bytes.
class TfWire {
 public:
  explicit TfWire(std::string_view bytes) : rest_(bytes) {}
  bool done() const { return rest_.empty(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto b = static_cast<unsigned char>(take(1)[0]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    throw std::runtime_error("a varint longer than 10 bytes");
  }
  uint64_t fixed(size_t bytes) {
    const std::string_view b = take(bytes);
    uint64_t v = 0;
    for (size_t i = bytes; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
  }
  std::string_view delimited() { return take(varint()); }
  // Skips a field of wire type `type` that the caller does not read.
  void skip(uint64_t type) {
    if (type == 0)
      varint();
    else if (type == 1)
      take(8);
    else if (type == 2)
      delimited();
    else if (type == 5)
      take(4);
    else
      throw std::runtime_error("wire type " + std::to_string(type));
  }

 private:
  std::string_view take(uint64_t n) {
    if (n > rest_.size()) throw std::runtime_error("a field runs past its message");
    const std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }
  std::string_view rest_;
};

inline TfScalar tf_decode_value(std::string_view bytes) {
  TfScalar v;
  TfWire w(bytes);
  while (!w.done()) {
    const uint64_t key = w.varint();
    if (key == (1 << 3 | 2)) {
      v.tag = std::string(w.delimited());
    } else if (key == (2 << 3 | 5)) {
      const auto bits = static_cast<uint32_t>(w.fixed(4));
      float f;
      std::memcpy(&f, &bits, 4);
      v.value = f;
    } else {
      w.skip(key & 7);
    }
  }
  return v;
}

inline TfEvent tf_decode_event(std::string_view bytes) {
  TfEvent e;
  TfWire w(bytes);
  while (!w.done()) {
    const uint64_t key = w.varint();
    if (key == (1 << 3 | 1)) {
      const uint64_t bits = w.fixed(8);
      std::memcpy(&e.wall_time, &bits, 8);
    } else if (key == (2 << 3 | 0)) {
      e.step = static_cast<int64_t>(w.varint());
    } else if (key == (3 << 3 | 2)) {
      e.file_version = std::string(w.delimited());
    } else if (key == (5 << 3 | 2)) {
      TfWire summary(w.delimited());
      while (!summary.done()) {
        const uint64_t k = summary.varint();
        if (k == (1 << 3 | 2)) {
          e.scalars.push_back(tf_decode_value(summary.delimited()));
        } else {
          summary.skip(k & 7);
        }
      }
    } else {
      w.skip(key & 7);
    }
  }
  return e;
}

// Every event of the file at `path`, in order.
inline std::vector<TfEvent> read_tf_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TfEvent> out;
  size_t at = 0;
  auto le = [&](size_t from, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[from + i]);
    return v;
  };
  while (at < bytes.size()) {
    const std::string where = path + " at byte " + std::to_string(at);
    if (bytes.size() - at < 12) throw std::runtime_error(where + ": a truncated record header");
    const uint64_t length = le(at, 8);
    if (le(at + 8, 4) != tf_masked_crc(std::string_view(bytes).substr(at, 8))) {
      throw std::runtime_error(where + ": the length's CRC does not match");
    }
    if (bytes.size() - at - 12 < length + 4) throw std::runtime_error(where + ": truncated data");
    const std::string_view data = std::string_view(bytes).substr(at + 12, length);
    if (le(at + 12 + length, 4) != tf_masked_crc(data)) {
      throw std::runtime_error(where + ": the data's CRC does not match");
    }
    out.push_back(tf_decode_event(data));
    at += 12 + length + 4;
  }
  return out;
}

}  // namespace tandem::testing
