// How `megatrain simulate --straggler-coding` shows a CodingStudy: a table per GPU count (every scheme's expected
// step, tokens/s, load, delay, fallback probability and where it pays), the transient sweep, and the verdict; or
// the same as JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "megatrain/perf/coding_at_scale.h"

namespace mt::perf {

// "never" or "[from, to]"-style text of a rate interval; used by the table and the docs.
std::string format_rates(const std::optional<RateInterval>& r);
// The verdict line: whether any scheme beats none at the study's process, and if not, the least rate and slowdown
// at which one would.
std::string coding_verdict(const CodingStudy& s);
std::string format_coding(const CodingStudy& s, const Job& job, const Cluster& c);
// {cluster, layout{tp, pp, virtual_stages, micro_batch, seq, global_batch}, process{rate, duration (null when
// persistent), slowdown, node_fraction, megascale}, rows[{gpus, dp, microbatches, replica_nodes, rate,
// expected_slow_replicas, healthy_step_seconds, healthy_seconds_per_load, schemes[{scheme, params, load, delay,
// p_fallback, waited_share, step_seconds (a coded scheme's upper bound), simulated_step_seconds, tokens_per_second, beats_none, paying_rates{from, to} | null, paying_slowdown | null}],
// transient[{duration (null: persistent), msgc_paying_rates, gc1_paying_rates, msgc_least_slowdown{slowdown, rate, load,
// params}, gc1_least_slowdown, msgc_simulated_slowdown, gc1_simulated_slowdown}]}], coding_pays, coding_pays_simulated, verdict}
nlohmann::json to_json(const CodingStudy& s, const Job& job, const Cluster& c);

}  // namespace mt::perf
