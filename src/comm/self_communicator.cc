// A world of one process (self_communicator.h). Tensors are the host's, as for the MPI backend.
#include "comm/self_communicator.h"

#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem::comm {
namespace {

// Copies the first `bytes` of `from` into `to`, both host tensors.
void copy_bytes(const Tensor& to, const Tensor& from, int64_t bytes, const char* what) {
  TANDEM_ASSERT(to.device() == Device::kCPU && from.device() == Device::kCPU, what,
                ": host tensors only");
  TANDEM_ASSERT(bytes >= 0 && bytes <= to.nbytes() && bytes <= from.nbytes(), what, ": ", bytes,
                " bytes do not fit");
  if (bytes > 0) std::memcpy(to.raw_data(), from.raw_data(), static_cast<size_t>(bytes));
}

class DoneSend final : public PendingSend {
 public:
  void wait() override {}
  bool done() override { return true; }
};

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  void send(const Tensor& t, int peer, int tag) override {
    check_peer(peer, "send");
    Tensor copy = Tensor::empty(t.shape(), t.dtype(), MemCategory::kCommunication, "self.message");
    copy_bytes(copy, t, t.nbytes(), "send");
    mailbox_[tag].push_back(std::move(copy));
  }
  std::unique_ptr<PendingSend> isend(const Tensor& t, int peer, int tag) override {
    send(t, peer, tag);
    return std::make_unique<DoneSend>();
  }
  // A receive with nothing sent would wait forever: it fails at once instead
  // (Note [Bounded waits] in communicator.h).
  void recv(const Tensor& t, int peer, int tag) override {
    check_peer(peer, "recv");
    std::deque<Tensor>& queue = mailbox_[tag];
    TANDEM_CHECK(!queue.empty(), "group '", name_, "' (one process): a receive with tag ", tag,
                 " has no message sent before it");
    TANDEM_CHECK(queue.front().nbytes() == t.nbytes(), "group '", name_, "': a receive of ",
                 t.nbytes(), " bytes gets a message of ", queue.front().nbytes());
    copy_bytes(t, queue.front(), t.nbytes(), "recv");
    queue.pop_front();
  }
  void all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                    const std::vector<int64_t>& send_rows) override {
    TANDEM_ASSERT(recv_rows.size() == 1 && send_rows.size() == 1 && recv_rows[0] == send_rows[0],
                  "group '", name_, "': an all-to-all of one process receives what it sends");
    if (send_rows[0] == 0) return;
    const int64_t row_bytes = in.nbytes() / in.size(0);
    copy_bytes(out, in, send_rows[0] * row_bytes, "all_to_all_v");
  }
  void all_reduce_sum(const Tensor&) override {}
  void reduce_scatter_sum(const Tensor& out, const Tensor& in) override {
    copy_bytes(out, in, in.nbytes(), "reduce_scatter_sum");
  }
  void all_gather(const Tensor& out, const Tensor& in) override {
    copy_bytes(out, in, in.nbytes(), "all_gather");
  }
  void broadcast(const Tensor&, int root) override { check_peer(root, "broadcast"); }
  void barrier() override {}
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return {mine}; }
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks,
                                         const std::string& name) override {
    TANDEM_ASSERT(ranks.size() == 1 && ranks[0] == 0, "group '", name,
                  "' of one process holds rank 0 alone");
    return std::make_unique<SelfCommunicator>(name);
  }

 private:
  void check_peer(int peer, const char* op) const {
    TANDEM_ASSERT(peer == 0, "group '", name_, "': ", op, " with rank ", peer,
                  " in a group of one process");
  }

  std::string name_;
  std::map<int, std::deque<Tensor>> mailbox_;  // messages sent to itself, by tag, oldest first
};

}  // namespace

std::unique_ptr<Communicator> self_world() { return std::make_unique<SelfCommunicator>("world"); }

}  // namespace tandem::comm
