// Subcommands of the `megatrain` binary. Each parses its own arguments (argv[0] is the subcommand name) and
// returns the process exit code; mt::Error escaping one is printed by main as "megatrain <cmd>: error: ...".
#pragma once

namespace mt::cli {

int cmd_tokenize(int argc, char** argv);      // tokenize encode|decode|train   (cmd_tokenize.cpp)
int cmd_prepare_data(int argc, char** argv);  // prepare-data                   (cmd_prepare_data.cpp)
int cmd_train(int argc, char** argv);         // train                          (cmd_train.cpp)
int cmd_generate(int argc, char** argv);      // generate                       (cmd_generate.cpp)
int cmd_eval(int argc, char** argv);          // eval                           (cmd_eval.cpp)
int cmd_convert(int argc, char** argv);       // convert                        (cmd_convert.cpp)
int cmd_launch(int argc, char** argv);        // launch                         (cmd_launch.cpp)
int cmd_diagnose(int argc, char** argv);      // diagnose                       (cmd_diagnose.cpp)
int cmd_notify(int argc, char** argv);        // notify                         (cmd_notify.cpp)
int cmd_status(int argc, char** argv);        // status                         (cmd_status.cpp)
int cmd_simulate(int argc, char** argv);      // simulate                       (cmd_simulate.cpp)
int cmd_trace(int argc, char** argv);         // trace merge                    (cmd_trace.cpp)
int cmd_version(int argc, char** argv);       // version, --version             (cmd_version.cpp)

}  // namespace mt::cli
