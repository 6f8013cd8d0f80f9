// megatrain train --config FILE.toml [--section.key=value ...]; megatrain train --help-config[=markdown]
#include <fmt/format.h>

#include <csignal>
#include <string>
#include <vector>

#include "megatrain/cli/blas_reexec.h"
#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/resources.h"
#include "megatrain/core/stop_request.h"
#include "megatrain/train/trainer.h"

namespace mt::cli {

int cmd_train(int argc, char** argv) {
  std::string config = resource_path("configs/tiny.toml");
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print(
          "usage: megatrain train [--config FILE.toml] [--section.key=value ...]\n"
          "       megatrain train --help-config[=markdown]   every config key: default, range, what it sets\n\n"
          "Trains a GPT as the TOML config says (default: configs/tiny.toml). Any config key can be overridden,\n"
          "e.g. --train.steps=100 --model.block=parallel --optim.name=lamb. Sections: model, data, optim, train,\n"
          "ckpt, sample, parallel (--help-config lists every key; docs/configuration.md). Progress goes to stdout and, as JSON lines, to\n"
          "<train.out_dir>/metrics.jsonl; checkpoints to <ckpt.dir> (default <train.out_dir>/ckpt).\n"
          "SIGTERM/SIGINT stop the run after the current step (with a checkpoint when checkpoints are configured).\n"
          "Exit codes: 0 done, 10 config, 11 data, 12 checkpoint (restarting cannot help); 20 non-finite, 21 timeout,\n"
          "22 peer lost, 23 device, 24 I/O, 25 silent data corruption (a restart may help); 30 stopped on request; 1 other errors.\n");
      return 0;
    }
    if (a == "--help-config" || a == "--help-config=text" || a == "--help-config=markdown") {
      fmt::print("{}", run_config_help(a == "--help-config=markdown"));
      return 0;
    }
    if (a.rfind("--help-config", 0) == 0) fail("{}: the format is text or markdown (e.g. --help-config=markdown)", a);
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
  // Before OpenBLAS does any work: a fallback core is replaced by re-executing this process (cli/blas_reexec.h).
  apply_blas_core(argc, argv);
  RunConfig cfg = with_kind(ErrorKind::Config, [&] { return load_run_config(config, overrides); });
  install_stop_handlers();  // SIGTERM/SIGINT: finish the step, checkpoint, exit with the Stopped code
  // A write to a peer that died (its socket closed) must fail as a lost peer, which the trainer reports with exit
  // code 22 after writing its snapshots for the restart, not kill this rank with SIGPIPE and no word: Gloo writes
  // with writev, which has no MSG_NOSIGNAL. (`launch` resets SIGPIPE to the default before exec, for any program.)
  std::signal(SIGPIPE, SIG_IGN);
  TrainResult r = run_training(cfg);
  fmt::print("{}: steps {}-{}, loss {:.4f} -> {:.4f}{}\n", r.stopped ? "stopped" : "done", r.first_step, r.last_step,
             r.first_loss, r.last_loss, r.last_val_loss >= 0 ? fmt::format(", val loss {:.4f}", r.last_val_loss) : "");
  return r.stopped ? exit_code(ErrorKind::Stopped) : 0;
}

}  // namespace mt::cli
