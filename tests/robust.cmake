# Robust training, rank side (issue 12): the flight recorder, heartbeats, injected faults, skipped batches.
mt_test(robust_flight_recorder_test mt_comm)
mt_test(robust_heartbeat_test mt_train)  # runs the built binary: heartbeat lines read from the pipe
add_dependencies(robust_heartbeat_test megatrain)
mt_test(robust_faults_test mt_train)  # parsing, and each kind fired in a 2-rank job of the built binary
add_dependencies(robust_faults_test megatrain)
mt_test(robust_skip_test mt_train)  # train.skip_steps against undisturbed runs
add_dependencies(robust_skip_test megatrain)
