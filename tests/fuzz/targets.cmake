# The fuzz targets: each NAME is tests/fuzz/fuzz_NAME.cpp with its seed corpus in tests/fuzz/corpus/NAME/. Adding a
# target is adding its name here (ctest then runs it like the others).
set(MT_FUZZ_TARGETS manifest safetensors shard_header run_config tokenizer tcp_store_protocol)
