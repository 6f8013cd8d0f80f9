mt_gpu_test(dist_nccl_test mt_dist)
