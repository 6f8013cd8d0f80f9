mt_test(parallel_tp_test mt_ckpt mt_parallel mt_model)
add_dependencies(parallel_tp_test megatrain)
mt_test(kernels_vocab_parallel_test mt_kernels)
mt_coretype_variants(parallel_tp_test "*/gpt2:*/chunks3:*/llama:*/dp2_tp2_llama_lamb")
