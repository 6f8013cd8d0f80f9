// What the supervisor shows of a job at one moment (the dashboard's snapshot, launch/dashboard.h), and its two
// renderings: JSON for the page and for scripts (GET /api/job), and the Prometheus text format (GET /metrics).
// The supervisor that watches every rank fills it: one node's agent, or the job driver on node 0 for a job of
// several nodes. Rendering is pure, so tests compare it with known answers.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/launch/rank_status.h"

namespace mt::launch {

struct RankView {
  RankStatus status;  // what the rank's heartbeats said (last_heard on the supervisor's clock)
  bool running = false;
  int node = 0;  // the node slot the rank runs on
};

struct JobView {
  // "starting" (no step yet), "running", "stopping" (a failure was detected), "restarting" (waiting out the
  // backoff), "done" or "failed" (the supervisor's last word; the page keeps showing it).
  std::string state = "starting";
  int attempt = 0, restarts = 0, max_restarts = 0;
  int nodes = 1, world = 0;
  double now = 0;       // the supervisor's clock (now_seconds) when the view was taken
  double started = 0;   // ... when the job started
  std::string detail;   // the latest line worth showing: a hang's blame, why it restarts, why it ended
  double useful_s = 0;  // the kept steps' time so far (useful_time.h): effective training = useful_s / uptime
  std::vector<RankView> ranks;
};

// The ranks of the attempt being watched, as views (node_of(i): the node rank i runs on; running has one flag per
// status, or fewer: the rest count as not running), and the attempt's state: "stopping" once a failure was
// detected, "running" once any rank completed a step in it, else "starting". Both supervisors use it.
void set_ranks(JobView& v, const std::vector<RankStatus>& status, const std::vector<bool>& running,
               const std::function<int(size_t)>& node_of, bool stopping);

// {"job": {state, attempt, restarts, max_restarts, nodes, world, uptime_s, useful_s, effective_training (useful_s /
//  uptime_s; null at uptime 0), detail, layout: {dp,pp,tp}|null,
//  step: {min, max}}, "ranks": [{rank, node, coord: [dp,pp,tp]|null, running, heard, age_s, step, phase, loss,
//  step_time, compute_time, tokens_per_s, mfu, rss, in_flight: [{group, op, seq, state}]}]}; numbers the rank has
// not reported are null.
nlohmann::json job_json(const JobView& v);

// The Prometheus text exposition format (version 0.0.4): job gauges (megatrain_job_*) and one series per rank of
// each rank gauge (megatrain_rank_*), labelled rank, node, dp, pp, tp. A value the rank has not reported is left
// out, not written as 0. Each metric has its HELP and TYPE lines.
std::string prometheus_text(const JobView& v);

}  // namespace mt::launch
