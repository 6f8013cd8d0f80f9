# CPU kernel tests: every op against a naive double reference and finite differences.
mt_test(kernels_basic_test mt_kernels)
mt_test(kernels_attention_test mt_kernels)
mt_test(kernels_loss_optim_test mt_kernels)
mt_gpu_test(kernels_cuda_test mt_kernels)
mt_coretype_variants(kernels_basic_test "*")
mt_coretype_variants(kernels_attention_test "*")
mt_coretype_variants(kernels_loss_optim_test "*")
