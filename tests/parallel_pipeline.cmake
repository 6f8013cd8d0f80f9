mt_test(parallel_pipeline_test mt_parallel)
mt_coretype_variants(parallel_pipeline_test "*")
