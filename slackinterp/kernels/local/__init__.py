"""The local kernel machinery: the backend, the sandbox, privileges, cgroups, and the warm
template that forks kernels (fork/). Sandboxed kernels reach the network through egress/.
"""
