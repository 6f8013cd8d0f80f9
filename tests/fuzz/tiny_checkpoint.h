// A tiny checkpoint in each format, written by the project's own savers, byte for byte the same on every call: the
// seed manifests in corpus/manifest/ were produced from them (tools/fuzz_seed_corpus), and the manifest target
// recreates the data files at start-up so that those manifests, and mutations of them, can be read to the end.
#pragma once
#include <string>

namespace mt::fuzz {

struct TinyCheckpoints {
  std::string format1_dir;  // step directory: model.safetensors, optim.safetensors, manifest.json (format 1)
  std::string format2_dir;  // step directory: two tensor-parallel rank files, manifest.json (format 2)
};

// Writes both checkpoints under root (created if needed; replaced if there).
TinyCheckpoints write_tiny_checkpoints(const std::string& root);

}  // namespace mt::fuzz
