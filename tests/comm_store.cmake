# Rendezvous stores (tcp, redis; a real redis-server is started by the test), launcher environment parsing,
# and `megatrain launch` supervision (runs the built binary).
mt_test(comm_store_test mt_comm)
mt_test(comm_launch_test mt_comm)
add_dependencies(comm_launch_test megatrain)
