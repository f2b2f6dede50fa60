"""Code that runs inside kernels: real modules, sent to a kernel by source and run there."""
