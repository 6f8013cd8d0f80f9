// Config parsing: defaults, types, overrides, and clear errors for malformed or unknown input.
#include <gtest/gtest.h>

#include "megatrain/core/error.h"
#include "megatrain/train/run_config.h"

using namespace mt;

namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& ov = {}) {
  try {
    parse_run_config(toml, "test.toml", ov);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, ParsesSectionsAndOverrides) {
  RunConfig c = parse_run_config(
      "[model]\nn_layer = 2\nblock = \"parallel\"\nwindow = 16\nrecompute = [1]\n[optim]\nname = \"lamb\"\nlr = 2e-3\n"
      "[data]\nseq_len = 64\n",
      "t.toml", {"--train.steps=7", "--model.d_model=192", "--data.dir=some/where", "--optim.weight_decay=0"});
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.block, BlockKind::Parallel);
  EXPECT_EQ(c.model.window, 16);
  EXPECT_EQ(c.model.recompute, (std::vector<bool>{false, true}));
  EXPECT_EQ(c.model.d_model, 192);
  EXPECT_EQ(c.optim.name, "lamb");
  EXPECT_FLOAT_EQ(c.optim.lr, 2e-3f);
  EXPECT_FLOAT_EQ(c.optim.weight_decay, 0.0f);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.data.dir, "some/where");  // a bare word is a string
  EXPECT_EQ(c.ckpt.dir, c.train.out_dir + "/ckpt");
}

TEST(RunConfig, RecomputeAll) {
  RunConfig c = parse_run_config("[model]\nn_layer = 3\nrecompute = \"all\"\n", "t.toml");
  EXPECT_EQ(c.model.recompute, (std::vector<bool>{true, true, true}));
}

TEST(RunConfig, MalformedTomlNamesFileAndLine) {
  std::string e = error_of("[model]\nn_layer = = 3\n");
  EXPECT_NE(e.find("test.toml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
}

TEST(RunConfig, UnknownKeysAreErrorsNamingTheKey) {
  std::string e = error_of("[optim]\nlrr = 1e-3\n");
  EXPECT_NE(e.find("unknown config key 'optim.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'lr'"), std::string::npos) << e;
  e = error_of("", {"--train.stesp=3"});
  EXPECT_NE(e.find("train.stesp"), std::string::npos) << e;
  e = error_of("[modle]\nn_layer = 1\n");
  EXPECT_NE(e.find("unknown config section 'modle'"), std::string::npos) << e;
}

TEST(RunConfig, WrongTypesAndValuesAreErrors) {
  EXPECT_NE(error_of("[model]\nn_layer = \"four\"\n").find("model.n_layer must be an integer"), std::string::npos);
  EXPECT_NE(error_of("[model]\nblock = \"diagonal\"\n").find("model.block"), std::string::npos);
  EXPECT_NE(error_of("[model]\nd_model = 100\nn_head = 3\n").find("model.d_model"), std::string::npos);
  EXPECT_NE(error_of("[data]\nseq_len = 4096\n").find("max_seq_len"), std::string::npos);
  EXPECT_NE(error_of("[optim]\nname = \"sgd\"\n").find("optim.name"), std::string::npos);
  EXPECT_NE(error_of("", {"--train.steps"}).find("section.key=value"), std::string::npos);
  EXPECT_NE(error_of("[train]\ndevice = \"tpu\"\n").find("train.device must be"), std::string::npos);
  EXPECT_NE(error_of("[train]\nattention = \"bogus\"\n").find("train.attention must be"), std::string::npos);
}

// The model's kinds are enums parsed once from their spelling (model/config.h): every spelling maps to its kind, in
// TOML and in command-line overrides; a misspelt kind or a non-string is refused naming the file, the key and the
// allowed spellings.
TEST(RunConfig, ModelKindsParseEverySpellingAndRefuseOthers) {
  const std::string odd = "[model]\nnorm = \"rmsnorm\"\nmlp = \"swiglu\"\npos = \"rope\"\nblock = \"parallel\"\n";
  RunConfig c = parse_run_config(odd, "t.toml");
  EXPECT_EQ(c.model.norm, NormKind::RmsNorm);
  EXPECT_EQ(c.model.mlp, MlpKind::SwiGlu);
  EXPECT_EQ(c.model.pos, PosKind::Rope);
  EXPECT_EQ(c.model.block, BlockKind::Parallel);
  const std::vector<std::string> back = {"--model.norm=layernorm", "--model.mlp=gelu", "--model.pos=learned",
                                         "--model.block=sequential"};
  c = parse_run_config(odd, "t.toml", back);
  EXPECT_EQ(c.model.norm, NormKind::LayerNorm);
  EXPECT_EQ(c.model.mlp, MlpKind::Gelu);
  EXPECT_EQ(c.model.pos, PosKind::Learned);
  EXPECT_EQ(c.model.block, BlockKind::Sequential);

  EXPECT_EQ(error_of("[model]\nnorm = \"batchnorm\"\n"),
            "test.toml: model.norm must be 'layernorm' or 'rmsnorm' (got 'batchnorm')");
  EXPECT_EQ(error_of("", {"--model.mlp=relu"}), "test.toml: model.mlp must be 'gelu' or 'swiglu' (got 'relu')");
  EXPECT_EQ(error_of("[model]\npos = \"alibi\"\n"), "test.toml: model.pos must be 'learned' or 'rope' (got 'alibi')");
  EXPECT_EQ(error_of("[model]\nblock = \"Parallel\"\n"),
            "test.toml: model.block must be 'sequential' or 'parallel' (got 'Parallel')");
  EXPECT_EQ(error_of("[model]\nnorm = 1\n"), "test.toml: model.norm must be a string");
}

TEST(RunConfig, MissingFileIsAnError) {
  try {
    load_run_config("/nonexistent/x.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.toml"), std::string::npos);
  }
}

}  // namespace
