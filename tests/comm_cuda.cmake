mt_gpu_test(comm_nccl_test mt_comm)
