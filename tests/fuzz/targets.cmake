# The fuzz targets: each NAME is tests/fuzz/fuzz_NAME.cpp with its seed corpus in tests/fuzz/corpus/NAME/. Adding a
# target is adding its name here (ctest then runs it like the others).
# TODO(issue 10): tcp_store_protocol, once the TCP store's wire protocol has been rewritten (helper h2).
set(MT_FUZZ_TARGETS manifest safetensors shard_header run_config tokenizer)
