mt_test(ckpt_checksum_test mt_ckpt)
# A build for this CPU (-march=native) must use the CPU's CRC instruction where it has one.
target_compile_definitions(ckpt_checksum_test PRIVATE MT_NATIVE_BUILD=$<BOOL:${MEGATRAIN_NATIVE}>)
mt_test(ckpt_safetensors_test mt_ckpt)
mt_test(ckpt_checkpoint_test mt_ckpt)
mt_test(ckpt_hf_gpt2_test mt_ckpt)
mt_test(ckpt_sharded_test mt_ckpt)
mt_test(ckpt_sharded_resume_test mt_ckpt)
add_dependencies(ckpt_sharded_resume_test megatrain)
