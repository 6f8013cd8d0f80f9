# Validation loss and sampling under tp / pp / dp x pp layouts against one process (runs the built binary).
mt_test(parallel_eval_test mt_ckpt)
add_dependencies(parallel_eval_test megatrain)
