mt_test(dist_pg_test mt_dist)
mt_test(dist_mesh_test mt_dist)
