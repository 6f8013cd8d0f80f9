mt_test(tokenizer_test mt_tokenizer)
