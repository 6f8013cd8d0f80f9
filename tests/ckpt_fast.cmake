# Fast checkpoints (issue 13): two-stage async saves, peer snapshots, one reader per dp group, resume fallback.
# Real multi-process jobs (runs the built binary); one case needs root to mount a small tmpfs and skips without.
mt_test(ckpt_fast_test mt_train)
add_dependencies(ckpt_fast_test megatrain)
