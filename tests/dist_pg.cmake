mt_test(dist_pg_test mt_dist)
mt_test(dist_mesh_test mt_dist)
# Groups and a mesh rendezvousing over each store kind (file, tcp, redis; a real redis-server is started).
mt_test(dist_pg_stores_test mt_dist)
