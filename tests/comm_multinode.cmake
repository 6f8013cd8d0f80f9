# Two "nodes" in two network namespaces joined by a veth pair (needs root and `ip netns`; skips otherwise): one
# `megatrain launch --nnodes 2` per namespace trains a dp=2 x tp=2 job that must match one process.
mt_test(comm_multinode_test mt_ckpt mt_comm)
add_dependencies(comm_multinode_test megatrain)
