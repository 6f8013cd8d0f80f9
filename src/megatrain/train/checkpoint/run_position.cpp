#include "megatrain/train/checkpoint/run_position.h"

#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/core/error.h"
#include "megatrain/data/window_order.h"
#include "megatrain/model/layout.h"
#include "megatrain/parallel/gpt_pipeline.h"

namespace mt {

namespace {

// The order an epoch visits the windows in, as a run configured with cfg over `windows` windows uses it and as
// checkpoint ck recorded it (checkpoints without "order" predate WindowOrder: they shuffled by Fisher-Yates). The
// window count is part of a shuffled order (a dataset that grew is permuted anew); it is compared when both sides
// know it.
std::string window_order_of(bool shuffle, const std::string& seed, const std::string& order, uint64_t windows) {
  if (!shuffle) return "sequential";
  return fmt::format("shuffled, seed {}, {}{}", seed, order, windows ? fmt::format(", {} windows", windows) : "");
}

}  // namespace

// What a checkpoint records besides the tensors: the model and optimizer, the position of the run, the layout.
nlohmann::json checkpoint_extra(const RunConfig& cfg, int step, const LoaderState& data, const SaveFacts& facts) {
  const uint64_t windows = facts.windows;
  const int micro = cfg.pipeline_microbatches();
  nlohmann::json extra = {{"model", model_config_to_json(cfg.model)},
                          {"optim_name", kind_name(cfg.optim.name)},
                          {"step", step},
                          {"data",
                           {{"epoch", data.epoch},
                            {"cursor", data.cursor},
                            {"dir", cfg.data.sources()[0].dir},
                            {"batch_size", cfg.data.batch_size},
                            {"seq_len", cfg.data.seq_len},
                            {"global_batch_size", cfg.data.batch_size * micro * cfg.parallel.dp},
                            {"shuffle", cfg.data.shuffle},
                            {"seed", cfg.data.seed},
                            {"order", cfg.data.shuffle ? WindowOrder::kName : "sequential"}}},
                          {"train", {{"steps", cfg.train.steps}, {"grad_accum", cfg.train.grad_accum}}},
                          {"parallel",
                           {{"dp", cfg.parallel.dp},
                            {"pp", cfg.parallel.pp},
                            {"tp", cfg.parallel.tp},
                            {"virtual_stages", cfg.parallel.virtual_stages},
                            {"microbatches", micro}}}};
  if (windows > 0) extra["data"]["windows"] = windows;  // what the order permutes: a grown dataset is another order
  if (facts.agreed_step == step)                        // only a check of this very step vouches for these parameters
    extra["sdc"] = {{"step", step}, {"hash", fmt::format("{:016x}", facts.agreed_hash)}, {"dp", cfg.parallel.dp}};
  if (!data.taken.empty()) {  // a blend: its sources, and the rows each has given (the position)
    nlohmann::json blend = nlohmann::json::array();
    for (const DataSource& src : cfg.data.sources()) blend.push_back({{"dir", src.dir}, {"weight", src.weight}});
    extra["data"]["blend"] = blend;
    extra["data"]["taken"] = data.taken;
    extra["data"]["since"] = data.since;
  }
  if (cfg.parallel.tp > 1) {
    // The tp layout the tensors were trained in (a sharded checkpoint's pieces follow it).
    ParamStore lay;
    declare_gpt_params(cfg.model, lay, cfg.parallel.tp, 0);
    nlohmann::json layout;
    for (const ParamInfo& p : lay.infos()) layout[p.name] = p.shard.describe();
    extra["tp_layout"] = layout;
  }
  if (cfg.parallel.pp > 1) {
    // Which virtual stage(s) held each tensor (a tied wte: the first and last).
    nlohmann::json layout;
    const int pp = cfg.parallel.pp, v = cfg.parallel.virtual_stages;
    for (int r = 0; r < pp; ++r) {
      GptPart part = pipeline_part(cfg.model, pp, v, r, cfg.parallel.stage_layers);
      ParamStore lay;
      declare_gpt_params(cfg.model, lay, 1, 0, part);
      for (const ParamInfo& p : lay.infos()) {
        int stage = r;  // embedding / head: the first / last virtual stage
        if (p.name.rfind("h.", 0) == 0) {
          const int l = std::stoi(p.name.substr(2));
          for (size_t c = 0; c < part.chunks.size(); ++c)
            if (l >= part.chunks[c].first && l < part.chunks[c].second) stage = static_cast<int>(c) * pp + r;
        } else if (part.head && !part.embedding) {
          stage = pp * v - 1;
        }
        layout[p.name].push_back(stage);
      }
    }
    extra["pp_layout"] = layout;
  }
  return extra;
}

const nlohmann::json& extra_field(const CheckpointReader& ck, const char* key, bool data,
                                  bool (*ok)(const nlohmann::json&), const char* expected) {
  const nlohmann::json& obj = data ? ck.extra()["data"] : ck.extra();
  const std::string path = data ? fmt::format("extra.data.{}", key) : fmt::format("extra.{}", key);
  MT_CHECK(obj.is_object() && obj.contains(key), "checkpoint {}: manifest.json lacks {}", ck.dir(), path);
  const nlohmann::json& v = obj[key];
  MT_CHECK(ok(v), "checkpoint {}: manifest.json: {} is {}, not {}", ck.dir(), path, v.dump(), expected);
  return v;
}

bool is_json_count(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}
bool is_json_step(const nlohmann::json& v) { return is_json_count(v) && v.get<uint64_t>() <= uint64_t{INT32_MAX}; }
bool is_json_string(const nlohmann::json& v) { return v.is_string(); }
bool is_json_object(const nlohmann::json& v) { return v.is_object(); }

SavedPosition saved_position(const CheckpointReader& ck) {
  SavedPosition p;
  p.step = extra_field(ck, "step", false, is_json_step, "a step number (0 .. 2^31-1)").get<int>();
  p.data.epoch = extra_field(ck, "epoch", true, is_json_count, "a non-negative integer").get<uint64_t>();
  p.data.cursor = extra_field(ck, "cursor", true, is_json_count, "a non-negative integer").get<uint64_t>();
  return p;
}

// The data position a checkpoint saved, carried over to this run's sources. A blend's position is the rows each source
// has given, matched by directory; a source new to the run starts at its beginning. When the sources or their weights
// changed, the shares count from here (`since` = `taken`): the new weights hold over the rows to come, rather than
// making up the past. A one-source run resumed as a blend (or the reverse) carries its one source's position over
// through its window count. Every change is said on the main rank.
LoaderState position_for_this_run(const RunConfig& cfg, const CheckpointReader& ck, const LoaderState& saved,
                                  uint64_t windows, bool say) {
  const nlohmann::json& d = ck.extra()["data"];
  const std::vector<DataSource> now = cfg.data.sources();
  // The saved sources and the rows each gave: a blend's lists, or one source's (dir, epoch x windows + cursor).
  std::vector<DataSource> was;
  std::vector<uint64_t> taken, since;
  const bool saved_blend = d.contains("blend");
  if (saved_blend) {
    const nlohmann::json &b = d["blend"], &t = d.contains("taken") ? d["taken"] : nlohmann::json(),
                         &sn = d.contains("since") ? d["since"] : nlohmann::json();
    MT_CHECK(b.is_array() && t.is_array() && sn.is_array() && t.size() == b.size() && sn.size() == b.size(),
             "checkpoint {}: manifest.json: extra.data.blend, .taken and .since must be lists of one length", ck.dir());
    for (size_t k = 0; k < b.size(); ++k) {
      MT_CHECK(b[k].is_object() && b[k].contains("dir") && b[k]["dir"].is_string() && b[k].contains("weight") &&
                   b[k]["weight"].is_number() && is_json_count(t[k]) && is_json_count(sn[k]) && sn[k] <= t[k],
               "checkpoint {}: manifest.json: extra.data.blend entry {} is not a {{dir, weight}} with counts taken >= "
               "since",
               ck.dir(), k);
      was.push_back({b[k]["dir"].get<std::string>(), b[k]["weight"].get<double>()});
      taken.push_back(t[k].get<uint64_t>());
      since.push_back(sn[k].get<uint64_t>());
    }
  } else {
    const std::string dir = d.contains("dir") && d["dir"].is_string() ? d["dir"].get<std::string>() : "";
    const uint64_t w = d.contains("windows") && is_json_count(d["windows"]) ? d["windows"].get<uint64_t>() : 0;
    if (now.size() == 1) return saved;  // one source then and now: the position as saved (the order check follows)
    was.push_back({dir, 1.0});
    taken.push_back(saved.epoch * w + saved.cursor);
    since.push_back(taken.back());
    if (say && w == 0 && saved.epoch > 0)
      fmt::print(stderr,
                 "warning: checkpoint {} records no window count for {}: its position in it is taken as "
                 "cursor {} of its first epoch\n",
                 ck.dir(), dir, saved.cursor);
  }
  auto find = [&](const std::string& dir) -> int {
    for (size_t k = 0; k < was.size(); ++k)
      if (was[k].dir == dir) return static_cast<int>(k);
    return -1;
  };
  if (now.size() == 1) {  // a blend resumed as one source: that source's rows, as (epoch, cursor)
    const int k = find(now[0].dir);
    const uint64_t t = k >= 0 ? taken[k] : 0;
    if (say)
      fmt::print("data: checkpoint {} was a blend; this run reads {} alone, {}\n", ck.dir(), now[0].dir,
                 k >= 0 ? fmt::format("from its row {} on", t)
                        : std::string("from its start (the blend did not hold it)"));
    return windows > 0 ? LoaderState(t / windows, t % windows) : LoaderState();
  }
  LoaderState out;
  double sum_was = 0, sum_now = 0;
  for (const DataSource& w : was) sum_was += w.weight;
  for (const DataSource& n : now) sum_now += n.weight;
  bool same = saved_blend && was.size() == now.size();
  for (const DataSource& n : now) {
    const int k = find(n.dir);
    out.taken.push_back(k >= 0 ? taken[k] : 0);
    out.since.push_back(k >= 0 ? since[k] : 0);
    same = same && k >= 0 && std::abs(was[k].weight / sum_was - n.weight / sum_now) <= 1e-12;
  }
  if (!same) {
    out.since = out.taken;
    if (say) {
      std::vector<std::string> a, b;
      for (const DataSource& w : was) a.push_back(fmt::format("{} {:.4g}", w.dir, w.weight / sum_was));
      for (const DataSource& n : now) b.push_back(fmt::format("{} {:.4g}", n.dir, n.weight / sum_now));
      fmt::print("data: the blend changed since checkpoint {} (was {}; now {}): each source continues where it was, "
                 "and the new shares hold from here\n",
                 ck.dir(), fmt::join(a, ", "), fmt::join(b, ", "));
    }
  }
  // Each source's position is a count into its epochs' window orders: under another seed or shuffle setting, the
  // rest of each source's current epoch repeats some windows and skips others (as warn_if_order_changed says of one
  // source).
  const bool saved_shuffle = !d.contains("shuffle") || !d["shuffle"].is_boolean() || d["shuffle"].get<bool>();
  const std::string saved_seed = d.contains("seed") ? d["seed"].dump() : "?";
  if (say && saved_blend &&
      (saved_shuffle != cfg.data.shuffle || (cfg.data.shuffle && saved_seed != std::to_string(cfg.data.seed))))
    fmt::print(stderr,
               "warning: checkpoint {} saved its blend's position in another window order ({}) than this "
               "run's ({}): the rest of each source's current epoch may repeat some windows and skip others\n",
               ck.dir(), saved_shuffle ? "shuffled, seed " + saved_seed : "sequential",
               cfg.data.shuffle ? "shuffled, seed " + std::to_string(cfg.data.seed) : "sequential");
  return out;
}

// A data position is a cursor into one window order: resumed under another (a changed seed, a dataset that grew or
// shrank, another megatrain's shuffle), the rest of the saved epoch reads some windows twice and skips others.
// That is allowed (the next epoch is a whole epoch again) but never silent: the main rank says so.
void warn_if_order_changed(const RunConfig& cfg, uint64_t windows, const CheckpointReader& ck,
                           const LoaderState& data) {
  // Only the description depends on these keys, so a value of the wrong type is shown as it is, never thrown.
  const nlohmann::json& d = ck.extra()["data"];
  auto key = [&](const char* k) { return d.contains(k) ? d[k] : nlohmann::json(); };
  const nlohmann::json shuffle = key("shuffle"), order = key("order"), w = key("windows");
  const uint64_t saved_windows = w.is_number_unsigned() ? w.get<uint64_t>() : 0;
  const uint64_t both = saved_windows > 0 && windows > 0 ? 1 : 0;
  const std::string saved = window_order_of(!shuffle.is_boolean() || shuffle.get<bool>(), key("seed").dump(),
                                            order.is_null()     ? "fisher-yates"
                                            : order.is_string() ? order.get<std::string>()
                                                                : order.dump(),
                                            both * saved_windows);
  const std::string now = window_order_of(cfg.data.shuffle, std::to_string(cfg.data.seed), WindowOrder::kName,
                                          both * windows);
  if (saved == now || data.cursor == 0) return;
  fmt::print(
      stderr,
      "warning: checkpoint {} saved its data position (epoch {}, cursor {}) in another window order "
      "({}) than this run's ({}): the rest of epoch {} may repeat some windows and skip others; the epochs from {} "
      "on are whole\n",
      ck.dir(), data.epoch, data.cursor, saved, now, data.epoch, data.epoch + 1);
}

}  // namespace mt
