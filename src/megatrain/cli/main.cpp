// The `megatrain` command: dispatches to one subcommand.
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/blas_core.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"train", mt::cli::cmd_train, "train a model from a TOML config (--section.key=value overrides)"},
    {"generate", mt::cli::cmd_generate, "sample text from a checkpoint"},
    {"eval", mt::cli::cmd_eval, "the loss of a checkpoint or an HF model on prepared data"},
    {"tokenize", mt::cli::cmd_tokenize,
     "encode/decode text (GPT-2's BPE, or an HF tokenizer.json: Llama 2/3, Mistral), or train a BPE"},
    {"prepare-data", mt::cli::cmd_prepare_data, "turn text / JSON-lines into token shards (train/val split)"},
    {"convert", mt::cli::cmd_convert, "import/export HF models (GPT-2, Llama, Mistral safetensors)"},
    {"launch", mt::cli::cmd_launch, "spawn local ranks (torchrun-style env) and supervise them"},
    {"status", mt::cli::cmd_status, "show a running job from its dashboard as text (steps, ranks not keeping up)"},
    {"notify", mt::cli::cmd_notify, "post one event to a webhook, as `launch --notify` does (job scripts' own events)"},
    {"diagnose", mt::cli::cmd_diagnose, "check this node (all-reduce, matmul rate, memory bandwidth) after a fault"},
    {"simulate", mt::cli::cmd_simulate, "predict step time, MFU and memory of a 3D-parallel job on a modelled cluster"},
    {"trace", mt::cli::cmd_trace, "merge the ranks' timelines into one Perfetto trace and check it"},
    {"version", mt::cli::cmd_version, "the version, git commit, build and libraries (also --version)"},
};

void usage(FILE* f) {
  std::fprintf(f, "usage: megatrain <command> [options]\n\ncommands:\n");
  for (auto& c : kCommands) std::fprintf(f, "  %-14s %s\n", c.name, c.help);
  std::fprintf(f, "\n`megatrain <command> --help` describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // A rank under `megatrain launch` (which gives it a heartbeat pipe) lets its parent, the agent, and the agent's
  // children attach to it: the agent runs gdb on a rank blamed for a hang (launch/stack_dump.h), and where Yama
  // limits ptrace to ancestors (ptrace_scope 1) gdb, a sibling, could not. Without Yama this fails and changes
  // nothing.
  if (std::getenv("MEGATRAIN_HEARTBEAT_FD")) ::prctl(PR_SET_PTRACER, ::getppid(), 0, 0, 0);
  // Line-buffered even into a pipe (e.g. under `megatrain launch`), so progress shows up as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) argv[1] = const_cast<char*>("version");
  // Hidden: a candidate OpenBLAS core's self-test, run by launch/blas_core.cpp in a child of its own.
  if (!std::strcmp(argv[1], mt::launch::kBlasSelfTestCommand)) return mt::launch::run_blas_self_test();
  for (auto& c : kCommands) {
    if (std::string(argv[1]) != c.name) continue;
    try {
      return c.fn(argc - 1, argv + 1);
    } catch (const mt::Error& e) {
      // The exit code says what kind of failure it was (core/error.h; docs/running.md, "Exit codes"), so a supervisor can
      // tell a restart that may help from one that cannot.
      std::fprintf(stderr, "megatrain %s: error: %s\n", c.name, e.what());
      if (e.kind != mt::ErrorKind::Internal)
        std::fprintf(stderr, "megatrain %s: exit code %d (%s error)\n", c.name, mt::exit_code(e.kind),
                     mt::kind_name(e.kind));
      return mt::exit_code(e.kind);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatrain %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "megatrain: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
