// The expert bias's update after each step (Note [Expert bias] in expert_bias.h).
#include "runtime/expert_bias.h"

#include <algorithm>
#include <vector>

namespace tandem::runtime {

namespace {

// b_e += rate * sign(mean - load_e), in double, b of the parameters' dtype.
template <typename T>
void move_bias(T* bias, const float* load, int64_t e, double rate) {
  double sum = 0;
  for (int64_t x = 0; x < e; ++x) sum += load[x];
  const double mean = sum / static_cast<double>(e);
  for (int64_t x = 0; x < e; ++x) {
    const double gap = mean - static_cast<double>(load[x]);
    const double sign = gap > 0 ? 1.0 : gap < 0 ? -1.0 : 0.0;
    bias[x] = static_cast<T>(static_cast<double>(bias[x]) + rate * sign);
  }
}

// The most loaded expert's rows over the mean of one layer's tally (0 for a layer that routed
// nothing).
double max_over_mean(const float* load, int64_t e) {
  double sum = 0, most = 0;
  for (int64_t x = 0; x < e; ++x) {
    sum += load[x];
    most = std::max(most, static_cast<double>(load[x]));
  }
  return sum > 0 ? most * static_cast<double>(e) / sum : 0.0;
}

}  // namespace

double update_expert_bias(model::Parameters& params, double rate, comm::Communicator* dp,
                          bool apply) {
  const Tensor& load = params.expert_load();
  if (!load.defined()) return -1;
  if (dp != nullptr && dp->size() > 1) dp->all_reduce_sum(load);
  const int64_t e = params.config().num_experts;
  const model::ModelWeights& weights = params.weights();
  // On a GPU the tallies and biases (a few floats a layer) come to the host and the biases go
  // back: the update is the CPU's arithmetic on either device.
  const bool host = load.device() == Device::kCPU;
  const Tensor host_load = host ? load : load.to(Device::kCPU);
  double balance = -1;
  // Every held layer's, the MTP modules' included (Megatron-LM updates every router's bias).
  for (int64_t l = 0; l < params.spec().held_layers(params.config()); ++l) {
    const Tensor& bias = model::held_layer(weights, l).expert_bias;
    if (!bias.defined()) continue;
    const float* pl = host_load.data<float>() + l * e;
    balance = std::max(balance, max_over_mean(pl, e));
    if (!apply) continue;
    const Tensor b = host ? bias : bias.to(Device::kCPU);
    if (b.dtype() == DType::kF64) {
      move_bias(b.data<double>(), pl, e, rate);
    } else {
      move_bias(b.data<float>(), pl, e, rate);
    }
    if (!host) bias.copy_from(b);
  }
  load.zero_();
  return balance;
}

}  // namespace tandem::runtime
