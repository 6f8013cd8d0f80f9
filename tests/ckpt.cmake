mt_test(ckpt_checksum_test mt_ckpt)
mt_test(ckpt_safetensors_test mt_ckpt)
mt_test(ckpt_checkpoint_test mt_ckpt)
mt_test(ckpt_hf_gpt2_test mt_ckpt)
