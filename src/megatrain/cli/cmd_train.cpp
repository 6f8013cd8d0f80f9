// megatrain train --config FILE.toml [--section.key=value ...]
#include <fmt/format.h>

#include <string>
#include <vector>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/resources.h"
#include "megatrain/train/trainer.h"

namespace mt::cli {

int cmd_train(int argc, char** argv) {
  std::string config = resource_path("configs/tiny.toml");
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print(
          "usage: megatrain train [--config FILE.toml] [--section.key=value ...]\n\n"
          "Trains a GPT as the TOML config says (default: configs/tiny.toml). Any config key can be overridden,\n"
          "e.g. --train.steps=100 --model.block=parallel --optim.name=lamb. Sections: model, data, optim, train,\n"
          "ckpt, sample (see configs/*.toml and README.md). Progress goes to stdout and, as JSON lines, to\n"
          "<train.out_dir>/metrics.jsonl; checkpoints to <ckpt.dir> (default <train.out_dir>/ckpt).\n");
      return 0;
    }
    if (a == "--config" || a == "-c") {
      MT_CHECK(i + 1 < argc, "--config needs a file");
      config = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config = a.substr(9);
    } else if (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos) {
      if (a.find('=') == std::string::npos) {
        MT_CHECK(i + 1 < argc, "override {} needs a value", a);
        a.append("=").append(argv[++i]);
      }
      overrides.push_back(a);
    } else {
      fail("unexpected argument '{}' (see megatrain train --help)", a);
    }
  }
  RunConfig cfg = load_run_config(config, overrides);
  TrainResult r = run_training(cfg);
  fmt::print("done: steps {}-{}, loss {:.4f} -> {:.4f}{}\n", r.first_step, r.last_step, r.first_loss, r.last_loss,
             r.last_val_loss >= 0 ? fmt::format(", val loss {:.4f}", r.last_val_loss) : "");
  return 0;
}

}  // namespace mt::cli
