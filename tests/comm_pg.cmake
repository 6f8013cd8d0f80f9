mt_test(comm_pg_test mt_comm)
mt_test(comm_mesh_test mt_comm)
# Groups and a mesh rendezvousing over each store kind (file, tcp, redis; a real redis-server is started).
mt_test(comm_pg_stores_test mt_comm)
