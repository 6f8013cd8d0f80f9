# The performance model (src/megatrain/perf): known answers, independent oracles, monotonicity, bad input.
mt_test(perf_model_test mt_perf mt_train)
