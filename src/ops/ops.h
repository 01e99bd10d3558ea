// Every op of the model, forward and backward, one declaration each; the device of the tensors
// picks the backend (cpu/ the reference kernels, cuda/ the GPU's). Ops never allocate their
// outputs: callers pass them. Argument order: outputs, inputs, then scalars. Float tensors are
// f32 or f64 on the CPU (all of one op's float tensors share a dtype) and bf16 or f32 on the GPU
// (per tensor: docs/cuda.md "Op dtypes"); index tensors are i32. Activations are row-major [N, C]
// with N = batch * seq tokens, token n at position n % seq of sequence n / seq.
// Weights are stored as Hugging Face does, [out, in]: y = x @ W^T.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/host_read.h"
#include "core/tensor.h"
#include "core/tuning.h"
#include "ops/row_blocks.h"

namespace tandem::ops {

// Whether an op adds into its output or overwrites it.
enum class Accumulate : uint8_t { kOverwrite, kAdd };

// Whether embedding_forward checks its ids (on a GPU that waits for the stream) or the caller
// already has (e.g. on the host, before copying them over).
enum class IdCheck : uint8_t { kCheck, kCheckedByCaller };

// How router_forward turns a token's logits into the k routing weights (docs/model.md
// "Feed-forward: mixture of experts").
enum class RouterScore : uint8_t {
  kSoftmaxOfSelected,  // the softmax over the k chosen logits (Mixtral; norm_topk_prob true)
  kSoftmaxOfAll,       // the softmax over all E logits, at the k chosen, not renormalised
  kSigmoid,            // sigmoid(logit) at the k chosen (DeepSeek-V3, norm_topk_prob false)
  kSigmoidNormalized,  // those k divided by their sum (+ 1e-20) (DeepSeek-V3)
};

// How router_forward chooses and weights (docs/model.md "DeepSeek-V3 routing"). For the sigmoid
// scores: the choice reads score + bias (the expert bias, when given); with groups > 0 the E
// experts form `groups` groups of E / groups, a group's value is the sum of its two best biased
// scores, and a token chooses among the experts of its group_topk best groups only (the others'
// are out of the choice, as Megatron-LM masks them with -inf). The k weights are multiplied by
// scaling.
struct RouterSpec {
  RouterScore score = RouterScore::kSoftmaxOfSelected;
  int64_t groups = 0, group_topk = 0;
  double scaling = 1.0;
  RouterSpec() = default;
  RouterSpec(RouterScore s) : score(s) {}  // NOLINT: a plain softmax router converts implicitly
  bool sigmoid() const {
    return score == RouterScore::kSigmoid || score == RouterScore::kSigmoidNormalized;
  }
};

// The router's losses (docs/model.md "Load balancing"), as router_loss_start and
// router_backward take them. The load-balancing term is
//   balance * sum over groups g and experts e of counts[g, e] * sum over g's rows n of q[n, e],
// q the scores: probs itself (softmax), or probs over their row's sum + 1e-20 (normalized, the
// sigmoid scores); the groups are counts' rows, each over N / G consecutive rows. The z-loss is
//   z * sum over rows n of logsumexp(logits[n])^2.
struct RouterLoss {
  double balance = 0;  // 0: no load-balancing term
  bool normalized = false;
  double z = 0;  // 0: no z-loss (and no logits needed)
};

// Which rows an expert past its capacity drops (--moe-token-drop-policy): the lowest routing
// weights, or the latest positions. Either way ties go to the earlier position, positions
// ordered as Megatron-LM's tokens are: position t of every sequence before position t + 1.
enum class TokenDropPolicy : uint8_t { kProbs, kPosition };

// moe_permutation's expert capacity (Note [Expert capacity] in core/footprint.h).
struct MoeCapacity {
  int64_t capacity = 0;  // rows each expert may take; 0: dropless
  TokenDropPolicy policy = TokenDropPolicy::kProbs;
  bool pad = false;  // every expert's block exactly `capacity` rows, -1 entries after its own
  int64_t seq = 1;   // tokens per sequence: row n is position n % seq of sequence n / seq
};

// ---- shapes and hyper-parameters of the ops below ----
// Causal attention with grouped-query heads: query head h uses KV head h / (heads / kv_heads).
// head_dim is q's and k's head width; v_head_dim v's and the output's (0: head_dim, as every
// family but DeepSeek-V3's MLA has it); scale multiplies q . k (0: 1 / sqrt(head_dim)).
// key_begin (Note [Document masking] in data/document_masks.h): int32 [batch * seq], on the ops'
// device; the query at position i of its sequence attends to positions key_begin[row] .. i only,
// key_begin[row] in [0, i]. Undefined: every query attends to positions 0 .. i (plain causal).
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  int64_t v_head_dim = 0;
  double scale = 0;
  Tensor key_begin = {};
  int64_t v_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  double softmax_scale() const;
};

// AdamW's hyper-parameters for one step.
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};

// A scalar an op made, on its way to the host (Note [Reads to the host ahead of use] in
// core/host_read.h): a read started on the device and how its values become the scalar (scale
// times a one-element f64 tensor's value, or any resolve function, which may throw: a loss whose
// targets were bad); get() waits for it the first time. then(f) applies f to the value once it
// is known. Copies share the read and its value. A CPU op's is ready at once.
class PendingScalar {
 public:
  using Resolve = std::function<double(HostRead&)>;
  PendingScalar() = default;
  explicit PendingScalar(double value) : value_(value) {}
  PendingScalar(HostRead read, double scale)
      : PendingScalar(std::move(read),
                      [scale](HostRead& r) { return scale * r.take_as<double>().at(0); }) {}
  PendingScalar(HostRead read, Resolve resolve)
      : pending_(std::make_shared<Pending>(Pending{std::move(read), std::move(resolve)})) {}
  double get() {
    if (!pending_) return value_;
    if (pending_->read.started()) pending_->value = pending_->resolve(pending_->read);
    return pending_->value;
  }
  PendingScalar then(std::function<double(double)> f) && {
    if (!pending_) return PendingScalar(f(value_));
    if (pending_->read.started()) {
      pending_->resolve = [inner = std::move(pending_->resolve), f = std::move(f)](HostRead& r) {
        return f(inner(r));
      };
    } else {
      pending_->value = f(pending_->value);
    }
    return std::move(*this);
  }

 private:
  struct Pending {
    HostRead read;
    Resolve resolve;
    double value = 0;
  };
  double value_ = 0;
  std::shared_ptr<Pending> pending_;
};

// Each op below dispatches on its first tensor's device to ops::cpu or ops::cuda (which declare
// the same list).
#include "ops/op_decls.inc"

// Note [Lanes]: independent pieces of work (an experts node's products, one expert each) may run
// at once. On the GPU, piece i runs on lane i % count(): lane 0 is the current stream, the others
// side streams that first wait for everything enqueued on the current stream so far; join()
// makes the current stream wait for every lane used. A piece must touch only what no other
// piece of the same Lanes touches (each expert its own rows and weights), so the values are
// those of running the pieces one after another, bit for bit: the same kernels on the same
// operands. It pays where one product is too small to fill the GPU (an expert's ~1,000 rows
// of the down projection give under half a wave of an H200's 132 SMs). Tensors the pieces
// use must outlive join() (the side streams' work is ordered before the current stream's
// next op, so memory freed after join() is safe to reuse). Each current stream has side
// streams of its own, so two compute streams' pieces never queue on one lane. On the CPU,
// pieces run in order.
class Lanes {
 public:
  static constexpr int kMaxLanes = static_cast<int>(kMaxExpertLanes);
  // --expert-lanes (Note [Performance settings] in core/tuning.h; 1: every piece on the current
  // stream).
  static int count();
  // On `on`'s device.
  explicit Lanes(const Tensor& on);
  ~Lanes();  // joins if join() was not called (unwinding; its own errors are dropped)
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  void run(int64_t piece, const std::function<void()>& fn);
  void join();

 private:
  bool cuda_ = false;
  bool joined_ = false;
  unsigned forked_ = 0;  // bit l: side lane l waits for the fork point
};

// Note [Grouped expert products]: an experts node's products (one per local expert, each over
// that expert's rows) run either as one piece each on Lanes or, on the GPU, as one call for all
// experts per product: the experts' first rows, as many for each as most of them have, in one
// batched call of one shape, the rest in one cuBLAS grouped call
// (Note [Batched bulk of the experts' products] in ops/cuda/grouped_linear.cc). Which is faster
// depends on the experts' rows (bench/results/families.md): with a few hundred rows an expert
// (128 experts, top-8, 4,096 tokens: 256 on average) each product alone fills a fraction of the
// GPU and the host's launches pace the node; the grouped forward ran 1.14 ms a layer against
// 1.97 on lanes, and with the batched bulk the input-gradient products ran 0.90 ms against 0.93
// on lanes. At 384 rows (64 experts of width 1,408, top-6) grouped products made the whole
// step 1.3% faster than lanes, and with a thousand or more (8 experts, top-2) cuBLAS's grouped
// kernels, before the batched bulk, ran at half the lanes' rate. So by default the forward's and
// the input gradient's products are grouped when the node's experts have fewer than
// kGroupedRowsBelow rows each on average (between the measured sides), and on lanes otherwise. The
// weight gradients stay on lanes: they add into f32 gradients, and the grouped call takes no f32
// output for bf16 operands. --expert-grouped overrides the choice (Note [Performance settings]
// in core/tuning.h): forward, input or forward,input (grouped whatever the rows), or none. Values
// are the same products' up to the kernels' summation order.
enum class ExpertPhase { kForward = 1, kInput = 2 };
inline constexpr int64_t kGroupedRowsBelow = 512;
// Whether `phase` of an experts node with `rows` rows over `experts` local experts runs grouped;
// --expert-grouped's override, if any, decides.
bool grouped_expert_phase(ExpertPhase phase, int64_t rows, int64_t experts);

// Throws tandem::Error naming a performance setting of `t` that no kernel has (an
// --attention-*-variant outside its table); a build without CUDA has no such kernel and takes any.
void check_tuning(const Tuning& t);

// sum_squares_start's value, waited for.
inline double sum_squares(const Tensor& x) { return sum_squares_start(x).get(); }

// router_loss_start's value, waited for.
inline double router_loss(const Tensor& probs, const Tensor& counts, const Tensor& logits,
                          const RouterLoss& loss) {
  return router_loss_start(probs, counts, logits, loss).get();
}

}  // namespace tandem::ops
