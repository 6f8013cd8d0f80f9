# Robust training, rank side (issue 12): the flight recorder, heartbeats, injected faults, skipped batches.
mt_test(robust_flight_recorder_test mt_comm)
