"""Kernels a gateway starts on its own host, confined by the shipped kernelspec: the launcher
(the local sandbox's plan, kernels/local/sandbox.py, run for each kernel the gateway starts),
its byte pipes, and `slackinterp kernelspec install`. Above both backends: it uses the local
sandbox and the gateway's signed moves."""
