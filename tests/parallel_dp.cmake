mt_test(parallel_dp_test mt_ckpt)
add_dependencies(parallel_dp_test megatrain)
mt_coretype_variants(parallel_dp_test "*/adamw:*/lamb")
