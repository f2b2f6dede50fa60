"""The local kernel machinery: the backend, the sandbox, privileges, cgroups, the warm
template that forks kernels, and the egress proxy sandboxed kernels reach the network through.
"""
