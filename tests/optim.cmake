# Optimizer tests: AdamW and LAMB steps against their formulas, LAMB's norm reduction, the learning-rate schedule.
mt_test(optim_test mt_optim mt_model)
mt_coretype_variants(optim_test "*")
