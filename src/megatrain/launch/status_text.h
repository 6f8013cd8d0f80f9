// `megatrain status`: the dashboard's /api/job (job_view.h, dashboard.h) as text for a terminal, for whoever is on a
// login node with no browser: the job's state and layout, its steps, loss, step times, MFU and effective training
// time, the last word (a hang's blame, why it restarts), the ranks that are not keeping up (dead, silent, behind the
// newest step, or waiting in a collective), and the newest events. Pure: tests compare it with known answers.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace mt::launch {

// A heartbeat older than this marks a rank as silent (the page's HEARTBEAT_STALE_S).
constexpr double kStaleHeartbeatSeconds = 6;

// The text for one /api/job answer; at most max_ranks ranks and max_events events are listed (the counts of the
// others are said).
std::string status_text(const nlohmann::json& api_job, int max_ranks = 10, int max_events = 5);

}  // namespace mt::launch
