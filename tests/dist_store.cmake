# Rendezvous stores (tcp, redis; a real redis-server is started by the test), launcher environment parsing,
# and `megatrain launch` supervision (runs the built binary).
mt_test(dist_store_test mt_dist)
mt_test(dist_launch_test mt_dist)
add_dependencies(dist_launch_test megatrain)
