# Tests of the CUDA backend's kernels (label `gpu`; they skip without a device, and are not built without nvcc).
mt_gpu_test(kernels_flash_attention_test mt_kernels)
mt_gpu_test(kernels_cudnn_attention_test mt_kernels)
