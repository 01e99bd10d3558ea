// The pipeline's messages between stages on other ranks (pipeline_trainer.h): what a send
// carries, the SEND and RECV actions on their streams, and when a delivered send's buffer goes.
#include <algorithm>

#include "core/device.h"
#include "core/error.h"
#include "ops/ops.h"
#include "runtime/device_streams.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {

using schedule::Action;
using schedule::ActionKind;

// The tensor a send carries. On the CPU the send runs now, on this thread, so a stage output is
// copied into a communication buffer and its activation storage goes now rather than when the
// receiver gets round to it (the message is in flight, not an activation). On the GPU the send
// is issued ahead on a pipeline stream: the tensor itself travels, held until the send is done.
Tensor PipelineTrainer::message_to_send(Tensor& src, bool activation) {
  if (!activation || streams_->issues_ahead()) return std::exchange(src, Tensor());
  Tensor buf = Tensor::empty(src.shape(), src.dtype(), MemCategory::kCommunication, "pp.send_f",
                             current_device());
  buf.copy_from(src);
  release_storage({&src});
  src = Tensor();
  return buf;
}

// Note [Pipeline messages]: activations go on tag 0 and gradients on tag 1; messages between a
// pair of ranks match in the order sent, which the validator has checked for the schedule. Each
// goes on its direction's stream (Note [Pipeline streams on the GPU] in groups.cc) after the
// compute stream's work so far (the tensor is ready, and a received buffer's block is no longer
// used there); a received tensor is used on the compute stream only after the receive.
void PipelineTrainer::communicate(const Action& a) {
  StageRuntime& s = local(a.stage);
  // Note [The update beside the first forward] (deferred_update.cc): a stage that receives its
  // input updates all its weights while it waits for it (the pipeline's warm-up bubble).
  if (a.kind == ActionKind::kRecvF) deferred_->update(s, s.params->numel());
  model::MicroBatchState& state = s.mbs[a.microbatch];
  const bool fwd = a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvF;
  const StreamId side = fwd ? StreamId::kPipelineForward : StreamId::kPipelineBackward;
  comm::Communicator& group = fwd ? groups_->pp_fwd() : groups_->pp_bwd();
  const int tag = fwd ? 0 : 1;
  SpanInfo span;
  span.track = "comm";
  span.name = schedule::to_string(a);
  streams_->wait_all(side, StreamId::kCompute);
  if (a.kind == ActionKind::kSendF || a.kind == ActionKind::kSendB) {
    const int peer = sched_.stage_rank[fwd ? a.stage + 1 : a.stage - 1];
    const Tensor buf =
        message_to_send(fwd ? state.layers.back().out : state.layers.front().d_x, fwd);
    streams_->run(side, std::move(span), [&] {
      pending_.push_back({action_index_, group.isend(buf, peer, tag)});
    });
    return;
  }
  const int64_t n = train_.micro_batch_size * model_.seq_length, h = model_.hidden_size;
  Tensor& dst = fwd ? state.input : state.d_output;
  // A received activation is in flight until layer 0's attention adopts it (Note [Hand-over]).
  dst = Tensor::empty({n, h}, s.params->activation_dtype(),
                      fwd ? MemCategory::kCommunication : MemCategory::kOther,
                      fwd ? "pp.recv_f" : "pp.recv_b", current_device());
  const int peer = sched_.stage_rank[fwd ? a.stage - 1 : a.stage + 1];
  streams_->run(side, std::move(span), [&] { group.recv(dst, peer, tag); });
  streams_->wait_all(StreamId::kCompute, side);
}

// Note [Sends done early]: on the GPU a delivered message's buffer goes now, not at the step's
// end, as the planner frees it (its "in flight" ends at the transfer's end).
void PipelineTrainer::drop_delivered_sends() {
  std::erase_if(pending_, [](const InFlight& p) { return p.send->done(); });
}

// Note [Send buffers released when known delivered] (schedule/send_release.cc): on the CPU a
// send's buffer goes at a place of this rank's list fixed by the schedule, so that every run
// (and the plan) holds the same buffers at each moment; the wait there finds it delivered.
void PipelineTrainer::release_sends(size_t index) {
  if (streams_->issues_ahead()) {
    drop_delivered_sends();
    return;
  }
  for (const int32_t send : releases_[index]) {
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const InFlight& p) {
      return p.action == static_cast<size_t>(send);
    });
    TANDEM_ASSERT(it != pending_.end(), "action ", index, " releases send ", send,
                  ", which is not in flight");
    it->send->wait();
    pending_.erase(it);
  }
}

void PipelineTrainer::wait_for_sends() {
  for (InFlight& p : pending_) p.send->wait();
  pending_.clear();
}

}  // namespace tandem::runtime
