mt_test(parallel_pp_test mt_ckpt mt_parallel mt_model)
add_dependencies(parallel_pp_test megatrain)
mt_coretype_variants(parallel_pp_test "*/dp2_pp2_tp2:*/interleaved:*/lamb:*/untied_accum_recompute")
