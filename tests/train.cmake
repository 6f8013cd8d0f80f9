mt_test(train_test mt_train)
mt_test(run_config_test mt_train)
add_dependencies(train_test megatrain)
