#include "megatrain/train/evaluate.h"

#include <cmath>

#include "megatrain/core/error.h"
#include "megatrain/data/loader.h"
#include "megatrain/parallel/pipeline_eval.h"

namespace mt {

namespace {

// One source's val split as evaluate() reads it: the step's global batch, unshuffled, dp rank's rows, no prefetch.
DataLoader open_val(const RunConfig& cfg, const std::string& dir, const Topology& topo, int micro) {
  return DataLoader(dir, "val", cfg.data.batch_size * micro, cfg.data.seq_len, false, 0, topo.coord.dp, topo.shape.dp,
                    0, cfg.model.vocab_size);
}

double evaluate_source(GPT& model, const RunConfig& cfg, const std::string& dir, Topology& topo, int micro, int step);

}  // namespace

void check_val_split(const RunConfig& cfg, const Topology& topo, int micro) {
  try {
    for (const DataSource& src : cfg.data.sources()) open_val(cfg, src.dir, topo, micro);
  } catch (const Error& e) {
    fail_as(ErrorKind::Data,
            "train.eval_every = {} evaluates on the val split, but it cannot be read: {}. Prepare the "
            "data with a val split (`megatrain prepare-data --val-fraction`), or set --train.eval_every=0",
            cfg.train.eval_every, e.what());
  }
}

// Validation loss: the mean over the first train.eval_batches batches of the val split (unshuffled, so every
// evaluation sees the same windows) of each batch's mean loss. A batch is the step's global batch, dp x
// microbatches x data.batch_size rows, so any layout sees the windows one process with that batch size sees: each
// dp rank takes its rows (through the pipeline stages with pp; with tp the model's vocab-parallel loss is the same
// on every tp rank), and the per-position loss sums and target counts are summed over pp (only the last stage has
// them) and dp. The activations move over the device mesh, the sums over the host mesh.
double evaluate(GPT& model, const RunConfig& cfg, Topology& topo, int micro, int step,
                std::vector<SourceLoss>* by_source) {
  const std::vector<DataSource> sources = cfg.data.sources();
  if (sources.size() == 1) return evaluate_source(model, cfg, sources[0].dir, topo, micro, step);
  double weights = 0, mean = 0;
  for (const DataSource& src : sources) weights += src.weight;
  for (const DataSource& src : sources) {
    const double loss = evaluate_source(model, cfg, src.dir, topo, micro, step);
    mean += src.weight / weights * loss;
    if (by_source) by_source->push_back({src.dir, src.weight / weights, loss});
  }
  return mean;
}

namespace {

double evaluate_source(GPT& model, const RunConfig& cfg, const std::string& dir, Topology& topo, int micro, int step) {
  DeviceMesh* host = topo.host_mesh.get();
  const int dp = topo.shape.dp;
  const bool pipelined = topo.shape.pp > 1;
  const int B = cfg.data.batch_size, T = cfg.data.seq_len;
  DataLoader val = with_kind(ErrorKind::Data, [&] { return open_val(cfg, dir, topo, micro); });
  const int n = static_cast<int>(std::min<uint64_t>(cfg.train.eval_batches, val.batches_per_epoch()));
  if (n == 0) return NAN;
  std::vector<float> sums(2 * static_cast<size_t>(n), 0.0f);  // per batch: loss sum, valid targets
  for (int i = 0; i < n; ++i) {
    Batch b = val.next();
    int64_t valid = 0;
    for (int32_t y : b.y) valid += y >= 0;
    double loss_sum;
    if (pipelined) {
      loss_sum = pipeline_eval_loss(model, topo.device_mesh->pp(), b.x.data(), b.y.data(), micro, B, T);
      if (topo.coord.pp != topo.shape.pp - 1) valid = 0;  // counted once, on the stage that has the loss
    } else {
      loss_sum = static_cast<double>(model.forward(b.x.data(), b.y.data(), b.B, b.T, false)) *
                 static_cast<double>(valid);
    }
    sums[2 * i] = static_cast<float>(loss_sum);
    sums[2 * i + 1] = static_cast<float>(valid);
  }
  if (host) {
    Tensor t = f32_view(sums.data(), {static_cast<int64_t>(sums.size())});
    if (pipelined) host->pp().allreduce(t)->wait();
    if (dp > 1) host->dp().allreduce(t)->wait();
  }
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += static_cast<double>(sums[2 * i]) / sums[2 * i + 1];
  mean /= n;
  // Every rank holds the same mean (the sums were reduced), so every rank throws together: no rank is left
  // waiting in a collective.
  if (!std::isfinite(mean))
    fail_as(ErrorKind::NonFinite,
            "step {}: the validation loss is not finite ({}, on the val split of {}): the model "
            "has diverged",
            step, mean, dir);
  return mean;
}

}  // namespace

}  // namespace mt
