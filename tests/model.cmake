mt_test(model_test mt_model)
mt_gpu_test(model_gpu_test mt_optim mt_model)  # GPT on CUDA (bf16) against the CPU fp32 GPT
mt_coretype_variants(model_test "*")
