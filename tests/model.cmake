mt_test(model_test mt_model mt_optim)
