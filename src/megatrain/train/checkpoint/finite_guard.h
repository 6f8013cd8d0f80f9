// No checkpoint with a non-finite value: before any file of a checkpoint is written, every rank learns whether any
// rank holds an inf/NaN (parameters, optimizer moments or its ZeRO slices of them), and all refuse together.
//
// Protocol: collective over every rank (one Agreement::which_ranks). The rank holding the bad value throws naming
// it (tensor, element, value); every other rank throws naming the ranks that hold one. All throw kind NonFinite, so
// no rank waits at a barrier for one that gave up (a hang until the timeout), and no manifest is committed over a
// shard another rank refused to write; root/latest keeps naming the last good checkpoint.
// Everything a checkpoint can take from a rank is scanned: the gathered and the sharded save both write from it.
#pragma once
#include <string>

#include "megatrain/comm/agreement.h"
#include "megatrain/train/checkpoint/shard_layout.h"

namespace mt {

// The first inf/NaN in what this rank holds, described for the error; "" when every value is finite.
std::string non_finite_value(const RankHoldings& h);

// Throws (on every rank) when any rank holds a non-finite value (above). staged_finite: stage 1 already found every
// value it copied finite, and what it copied is everything this rank holds (pieces_cover_holdings): the scan is
// skipped. Otherwise (or to name the value) it scans.
void refuse_non_finite(const RankHoldings& h, Agreement& agreement, int step, bool staged_finite = false);

}  // namespace mt
