# Data pipeline: shards, corpus readers, loader, prepare-data.
mt_test(data_shard mt_data)
mt_test(data_corpus mt_data)
mt_test(data_loader mt_data)
mt_test(data_prepare mt_data)
