# Robust training, rank side (issue 12): the flight recorder, heartbeats, injected faults, skipped batches.
mt_test(robust_flight_recorder_test mt_comm)
mt_test(robust_heartbeat_test mt_train)  # runs the built binary: heartbeat lines read from the pipe
add_dependencies(robust_heartbeat_test megatrain)
