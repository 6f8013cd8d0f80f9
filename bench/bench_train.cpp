// Training-step throughput of the CPU backend on the GPT-2 124M shape (12 layers, d_model 768, 12 heads, vocab
// 50257 padded to 50304) with AdamW, compared with the OpenBLAS sgemm FLOP/s measured in the same run.
// Prints one JSON object. Usage: bench_train [--steps N] [--shapes 4x64,8x256] [--layers L]
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

using namespace mt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// sgemm FLOP/s: the median of several large square products (the machine's practical matmul peak).
double sgemm_flops(int n, int reps) {
  HostBuffer a(size_t(n) * n * 4), b(size_t(n) * n * 4), c(size_t(n) * n * 4);
  Rng r(1);
  for (size_t i = 0; i < size_t(n) * n; ++i) a.f32()[i] = r.uniform(), b.f32()[i] = r.uniform();
  std::vector<double> t;
  for (int i = 0; i < reps + 1; ++i) {
    double t0 = now_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.f32(), n, b.f32(), n, 0.0f, c.f32(), n);
    if (i > 0) t.push_back(now_seconds() - t0);
  }
  return 2.0 * n * n * n / median(t);
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

long peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5, layers = 12;
  std::vector<std::pair<int, int>> shapes = {{4, 64}, {8, 256}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--layers" && i + 1 < argc)
      layers = std::atoi(argv[++i]);
    else if (a == "--shapes" && i + 1 < argc) {
      shapes.clear();
      std::string s = argv[++i];
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find(',', p);
        std::string one = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
        int B = 0, T = 0;
        std::sscanf(one.c_str(), "%dx%d", &B, &T);
        shapes.push_back({B, T});
        if (q == std::string::npos) break;
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_train [--steps N] [--shapes 4x64,8x256] [--layers L]\n");
      return 2;
    }
  }
  ModelConfig cfg;  // GPT-2 124M
  cfg.n_layer = layers;
  cfg.max_seq_len = 1024;
  auto ops = make_cpu_ops();
  GPT model(cfg, *ops);
  model.init_weights(1);
  OptimConfig oc;
  Optimizer opt(oc, model.params(), *ops);
  long rss_model = peak_rss_mb();

  double sgemm = sgemm_flops(2048, 5);
  utsname un{};
  uname(&un);
  nlohmann::json out = {{"benchmark", "train_step_cpu"},
                        {"model",
                         {{"n_layer", cfg.n_layer},
                          {"d_model", cfg.d_model},
                          {"n_head", cfg.n_head},
                          {"vocab", cfg.padded_vocab()},
                          {"params", cfg.num_params()}}},
                        {"optimizer", "adamw"},
                        {"machine", {{"cpu", cpu_name()}, {"threads", omp_get_max_threads()}, {"kernel", un.release}}},
                        {"sgemm_gflops", sgemm / 1e9},
                        {"rss_after_alloc_mb", rss_model},
                        {"runs", nlohmann::json::array()}};
  Rng rng(3);
  int step = 0;
  for (auto [B, T] : shapes) {
    std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
    for (auto& v : x) v = static_cast<int32_t>(rng.below(cfg.vocab_size));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(cfg.vocab_size));
    std::vector<double> times, fwd, bwd, upd;
    for (int s = 0; s < steps + 1; ++s) {  // the first step allocates activations and warms caches: not timed
      double t0 = now_seconds();
      model.params().zero_grads();
      model.forward(x.data(), y.data(), B, T, true);
      double t1 = now_seconds();
      model.backward();
      double t2 = now_seconds();
      double norm = global_grad_norm(*ops, model.params());
      opt.step(model.params(), 1e-4f, norm > 1 ? static_cast<float>(1 / norm) : 1.0f, ++step);
      double t3 = now_seconds();
      if (s > 0) {
        times.push_back(t3 - t0);
        fwd.push_back(t1 - t0);
        bwd.push_back(t2 - t1);
        upd.push_back(t3 - t2);
      }
    }
    double t = median(times);
    double flops = cfg.flops_per_token(T) * B * T / t;
    // Re-measure sgemm after each shape so a drifting machine shows up in the JSON.
    double sgemm_after = sgemm_flops(2048, 3);
    out["runs"].push_back({{"B", B},
                           {"T", T},
                           {"step_seconds_median", t},
                           {"forward_seconds", median(fwd)},
                           {"backward_seconds", median(bwd)},
                           {"optimizer_seconds", median(upd)},
                           {"tokens_per_second", B * T / t},
                           {"model_gflops", flops / 1e9},
                           {"fraction_of_sgemm", flops / sgemm},
                           {"sgemm_gflops_after", sgemm_after / 1e9},
                           {"peak_rss_mb", peak_rss_mb()}});
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
