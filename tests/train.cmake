mt_test(train_test mt_train)
mt_test(run_config_test mt_train)
add_dependencies(train_test megatrain)
mt_gpu_test(train_gpu_test mt_train)  # train.device = "cuda" vs the CPU run
if(TARGET train_gpu_test)
  add_dependencies(train_gpu_test megatrain)
endif()
mt_test(train_planes_test mt_train)  # host vs device plane of process groups, checked on the CPU
add_dependencies(train_planes_test megatrain)
# Observers, the stop request, exit codes per error kind, config agreement across ranks (runs the built binary).
mt_test(train_control_test mt_train)
add_dependencies(train_control_test megatrain)
mt_test(train_finite_test mt_train)  # no checkpoint with a non-finite value; diverging runs stop (issue 10 item 3)
add_dependencies(train_finite_test megatrain)
